//! The transformer ops of issue 17 as compositions of existing ops: ONNX `Attention` (opsets
//! 23 to 25: matmul, softmax, tanh for the softcap, concat for the KV cache, broadcast_to +
//! reshape for grouped-query heads, additive masks), `RotaryEmbedding` and `LinearAttention`
//! (see their functions).
//!
//! Contract of `Attention` (ONNX's reference semantics):
//!
//! - Q/K/V are 4-D `(batch, heads, seq, head_size)`, or 3-D `(batch, seq, heads * head_size)`
//!   with `q_num_heads` / `kv_num_heads`; a 3-D output is 3-D again. `past_key`/`past_value`
//!   are concatenated on the sequence axis and returned as `present_key`/`present_value`.
//! - Q and K are each scaled by `sqrt(scale)` (default `scale = 1/sqrt(head_size)`); KV heads
//!   are repeated for grouped-query attention (`q_num_heads` a multiple of `kv_num_heads`).
//! - `softcap > 0` maps the scores through `softcap * tanh(s / softcap)` before the masks.
//! - The additive bias is the mask (a bool mask is 0 where true and -inf where false; a short
//!   mask is padded with false / -inf) plus the causal mask (`is_causal`, bottom-right aligned
//!   after the past), the sliding window (`left_window_size`/`right_window_size`, opset 25)
//!   and the padding mask of `nonpad_kv_seqlen` (opset 24). The causal, window and padding
//!   parts need static sequence lengths and a constant `nonpad_kv_seqlen`; they become
//!   constants.
//! - A query row whose every key is masked gets zero weights (ONNX's rule), when the masking
//!   is known at import (causal / window / padding) or comes from a bool mask. A row that a
//!   run-time *float* mask sets to -inf everywhere gives NaN, as a plain softmax does.
//! - `qk_matmul_output_mode` 0 and 1 return the (softcapped) scores, 2 the scores plus the
//!   bias, 3 the softmax weights; `softmax_precision` runs the softmax in that float type.
//!
//! ```text
//! Attention(Q, K, V; is_causal=1)   # Q: (2, 3, 4, 8), K, V: (2, 3, 6, 8)
//!   → qs = R.multiply(Q, sqrt(1/sqrt(8)));  ks = R.multiply(K, sqrt(1/sqrt(8)))
//!     s  = R.matmul(qs, R.permute_dims(ks, axes=[0, 1, 3, 2]))
//!     p  = R.nn.softmax(R.add(s, metadata[...] /* (4, 6): 0 or -inf */), axis=-1)
//!     Y  = R.matmul(p, V)
//! ```

use super::super::{Attrs, Importer, Out, Val, input, invalid, req};
use super::reduce::const_of;
use crate::error::Result;
use crate::ir::{DType, Dim, ExprId};
use crate::op::{Op, ReduceAttrs};

/// The most elements of the constant masks built at import time.
const MAX_MASK: i64 = 1 << 26;

fn stat(d: &Dim, what: &str) -> Result<i64> {
    d.as_static()
        .ok_or_else(|| invalid(format!("Attention needs a static {what}, found `{d}`")))
}

/// The largest finite value of a float dtype.
fn finite_max(dt: DType) -> Option<f64> {
    Some(match dt {
        DType::F64 => f64::MAX,
        DType::F32 => f64::from(f32::MAX),
        DType::F16 => 65504.0,
        DType::BF16 => 3.389_531_389_251_535_5e38,
        _ => return None,
    })
}

/// A 3-D `(batch, seq, heads * size)` tensor as `(batch, heads, seq, size)`.
fn split_heads(im: &mut Importer<'_>, x: ExprId, heads: i64, what: &str) -> Result<ExprId> {
    let (d, _) = im.dims(x)?;
    let hidden = stat(&d[2], what)?;
    if heads <= 0 || hidden % heads != 0 {
        return Err(invalid(format!(
            "Attention: the hidden size {hidden} of {what} is not a multiple of {heads} heads"
        )));
    }
    let s = im.b.shape(vec![
        d[0].clone(),
        d[1].clone(),
        Dim::Static(heads),
        Dim::Static(hidden / heads),
    ]);
    let r = im.emit(Op::Reshape, vec![x, s])?;
    im.emit(
        Op::PermuteDims {
            axes: Some(vec![0, 2, 1, 3]),
        },
        vec![r],
    )
}

/// Converts one `Attention` node (see the module docs).
pub(crate) fn attention(
    im: &mut Importer<'_>,
    node: &super::super::NodeProto,
    a: &Attrs<'_>,
) -> Result<Vec<Out>> {
    let mut q = im.expr(req(node, 0)?)?;
    let mut k = im.expr(req(node, 1)?)?;
    let mut v = im.expr(req(node, 2)?)?;
    let (qd, dt) = im.dims(q)?;
    let max = finite_max(dt)
        .ok_or_else(|| invalid(format!("Attention needs float inputs, found {dt}")))?;
    let rank3 = match qd.len() {
        3 => true,
        4 => false,
        r => {
            return Err(invalid(format!(
                "Attention: Q must be 3-D or 4-D, found rank {r}"
            )));
        }
    };
    for (e, what) in [(k, "K"), (v, "V")] {
        if im.dims(e)?.0.len() != qd.len() {
            return Err(invalid(format!("Attention: {what} must have Q's rank")));
        }
    }
    if rank3 {
        let (qh, kvh) = (a.int("q_num_heads", 0), a.int("kv_num_heads", 0));
        if qh <= 0 || kvh <= 0 {
            return Err(invalid(
                "Attention with 3-D inputs needs q_num_heads and kv_num_heads",
            ));
        }
        q = split_heads(im, q, qh, "Q")?;
        k = split_heads(im, k, kvh, "K")?;
        v = split_heads(im, v, kvh, "V")?;
    }
    let (qd, _) = im.dims(q)?;
    // The KV cache.
    let past = match (input(node, 4), input(node, 5)) {
        (Some(pk), Some(pv)) => Some((pk, pv)),
        (None, None) => None,
        _ => return Err(invalid("Attention: past_key and past_value go together")),
    };
    let mut past_len = 0i64;
    if let Some((pk, pv)) = past {
        let pk = im.expr(pk)?;
        let pv = im.expr(pv)?;
        let (pd, _) = im.dims(pk)?;
        let Some(pl) = pd.get(2).filter(|_| pd.len() == 4) else {
            return Err(invalid(format!(
                "Attention: past_key must be 4-D (batch, heads, past, size), found rank {}",
                pd.len()
            )));
        };
        past_len = stat(pl, "past length")?;
        let tk = im.b.tuple(vec![pk, k])?;
        k = im.emit(Op::Concat { axis: Some(2) }, vec![tk])?;
        let tv = im.b.tuple(vec![pv, v])?;
        v = im.emit(Op::Concat { axis: Some(2) }, vec![tv])?;
    }
    let (present_k, present_v) = (k, v);
    let (kd, _) = im.dims(k)?;
    let (vd, _) = im.dims(v)?;
    let batch = qd[0].clone();
    let q_heads = stat(&qd[1], "number of Q heads")?;
    let kv_heads = stat(&kd[1], "number of KV heads")?;
    let sq = stat(&qd[2], "query length")?;
    let skv = stat(&kd[2], "key length")?;
    let head = stat(&qd[3], "head size")?;
    // Scale Q and K by sqrt(scale) each, in the input dtype (as ONNX's reference).
    let scale = if a.has("scale") {
        a.float("scale", 1.0)
    } else {
        1.0 / (head as f64).sqrt()
    };
    let root = im.scalar(scale.sqrt(), dt);
    let qs = im.emit(Op::Multiply, vec![q, root])?;
    let ks = im.emit(Op::Multiply, vec![k, root])?;
    // Grouped-query attention: repeat each KV head (h0, h0, h1, h1, ...).
    let (ks, v) = if q_heads != kv_heads {
        if kv_heads <= 0 || q_heads % kv_heads != 0 {
            return Err(invalid(format!(
                "Attention: {q_heads} query heads are not a multiple of {kv_heads} KV heads"
            )));
        }
        let rep = q_heads / kv_heads;
        let mut out = Vec::new();
        for (e, d) in [(ks, &kd), (v, &vd)] {
            let x = im.emit(Op::ExpandDims { axis: vec![2] }, vec![e])?;
            let wide = im.b.shape(vec![
                d[0].clone(),
                Dim::Static(kv_heads),
                Dim::Static(rep),
                d[2].clone(),
                d[3].clone(),
            ]);
            let b = im.emit(Op::BroadcastTo, vec![x, wide])?;
            let s = im.b.shape(vec![
                d[0].clone(),
                Dim::Static(q_heads),
                d[2].clone(),
                d[3].clone(),
            ]);
            out.push(im.emit(Op::Reshape, vec![b, s])?);
        }
        (out[0], out[1])
    } else {
        (ks, v)
    };
    let kt = im.emit(
        Op::PermuteDims {
            axes: Some(vec![0, 1, 3, 2]),
        },
        vec![ks],
    )?;
    let mut scores = im.emit(Op::Matmul { out_dtype: None }, vec![qs, kt])?;
    let softcap = a.float("softcap", 0.0);
    if softcap > 0.0 {
        let c = im.scalar(softcap, dt);
        let d = im.emit(Op::Divide, vec![scores, c])?;
        let t = im.emit(Op::Tanh, vec![d])?;
        scores = im.emit(Op::Multiply, vec![t, c])?;
    }
    // The masks known at import: causal, sliding window, padding of nonpad_kv_seqlen.
    let nonpad = match input(node, 6) {
        Some(n) => {
            if past.is_some() {
                return Err(invalid(
                    "Attention: nonpad_kv_seqlen cannot be combined with a past cache",
                ));
            }
            Some(im.const_i64s(n)?)
        }
        None => None,
    };
    let causal = a.int("is_causal", 0) != 0;
    let (left, right) = (
        a.int("left_window_size", -1),
        a.int("right_window_size", -1),
    );
    let window = left >= 0 || right >= 0;
    let allowed: Option<(Vec<i64>, Vec<bool>)> = if causal || window || nonpad.is_some() {
        let offsets: Vec<i64> = match &nonpad {
            Some(n) => n.iter().map(|&l| l.saturating_sub(sq)).collect(),
            None => vec![past_len],
        };
        let nb = offsets.len() as i64;
        let total = nb
            .checked_mul(sq)
            .and_then(|x| x.checked_mul(skv))
            .filter(|&t| t <= MAX_MASK)
            .ok_or_else(|| invalid("Attention: the mask would be too large"))?;
        let mut m = Vec::with_capacity(usize::try_from(total).unwrap_or(0));
        for (b, &off) in offsets.iter().enumerate() {
            for i in 0..sq {
                for j in 0..skv {
                    let diff = i.saturating_add(off).saturating_sub(j);
                    let mut ok = true;
                    if causal {
                        ok &= diff >= 0;
                    }
                    if left >= 0 {
                        ok &= diff <= left;
                    }
                    if right >= 0 {
                        ok &= diff.saturating_neg() <= right;
                    }
                    if let Some(n) = &nonpad {
                        ok &= j < n.get(b).copied().unwrap_or(0);
                    }
                    m.push(ok);
                }
            }
        }
        let shape = if nonpad.is_some() {
            vec![nb, 1, sq, skv]
        } else {
            vec![sq, skv]
        };
        Some((shape, m))
    } else {
        None
    };
    // The user's mask, padded to the key length.
    let mask = match input(node, 3) {
        None => None,
        Some(n) => {
            let m = im.expr(n)?;
            let (md, mdt) = im.dims(m)?;
            let last = md
                .last()
                .ok_or_else(|| invalid("Attention: attn_mask must have at least one dim"))?;
            let ml = stat(last, "mask length")?;
            let m = if ml < skv {
                let mut pd: Vec<i64> = Vec::with_capacity(md.len());
                for d in &md[..md.len() - 1] {
                    pd.push(stat(d, "mask shape")?);
                }
                pd.push(skv - ml);
                let count = pd
                    .iter()
                    .try_fold(1i64, |acc, &d| acc.checked_mul(d))
                    .filter(|&c| c <= MAX_MASK)
                    .ok_or_else(|| invalid("Attention: the mask padding would be too large"))?;
                let fill = if mdt == DType::Bool {
                    0.0
                } else {
                    f64::NEG_INFINITY
                };
                let c = const_of(mdt, pd, &vec![fill; usize::try_from(count).unwrap_or(0)])?;
                let ce = im.b.constant(c);
                let t = im.b.tuple(vec![m, ce])?;
                im.emit(
                    Op::Concat {
                        axis: Some(md.len() as i64 - 1),
                    },
                    vec![t],
                )?
            } else if ml > skv {
                return Err(invalid(format!(
                    "Attention: attn_mask has {ml} keys, more than the {skv} keys"
                )));
            } else {
                m
            };
            Some((m, mdt == DType::Bool))
        }
    };
    let static01 = |im: &mut Importer<'_>, (shape, m): &(Vec<i64>, Vec<bool>)| -> Result<ExprId> {
        let vals: Vec<f64> = m.iter().map(|&b| if b { 1.0 } else { 0.0 }).collect();
        let c = const_of(dt, shape.clone(), &vals)?;
        Ok(im.b.constant(c))
    };
    // The static part as a bias: 0 where allowed, else -inf (or the finite floor `-max`).
    let static_bias = |im: &mut Importer<'_>,
                       (shape, m): &(Vec<i64>, Vec<bool>),
                       floor: bool|
     -> Result<ExprId> {
        let off = if floor { -max } else { f64::NEG_INFINITY };
        let vals: Vec<f64> = m.iter().map(|&b| if b { 0.0 } else { off }).collect();
        let c = const_of(dt, shape.clone(), &vals)?;
        Ok(im.b.constant(c))
    };
    // Rows with no allowed key in the static part (they are zeroed whatever the mask says).
    let static_empty_row = allowed.as_ref().is_some_and(|(_, m)| {
        let row = usize::try_from(skv).unwrap_or(1).max(1);
        m.chunks(row).any(|r| !r.iter().any(|&b| b))
    });
    let keep = |axis: i64| {
        Op::Max(Box::new(ReduceAttrs {
            axis: Some(vec![axis]),
            keepdims: true,
        }))
    };
    // bias: the additive bias (mode 2's output); soft: the bias the softmax sees, where a
    // guarded row has the finite floor `-max` instead of -inf so it does not become NaN before
    // the guard zeroes it (exp of the floor is 0 in the other rows too); guard: per-row 1/0
    // (None: no row can be fully masked, or only by a run-time float mask).
    let static_guard = |im: &mut Importer<'_>, al: &(Vec<i64>, Vec<bool>)| -> Result<ExprId> {
        let s = static01(im, al)?;
        im.emit(keep(-1), vec![s])
    };
    let (bias, soft, guard): (Option<ExprId>, Option<ExprId>, Option<ExprId>) =
        match (&mask, &allowed) {
            (None, None) => (None, None, None),
            (None, Some(al)) => {
                let b = static_bias(im, al, false)?;
                if static_empty_row {
                    let f = static_bias(im, al, true)?;
                    let g = static_guard(im, al)?;
                    (Some(b), Some(f), Some(g))
                } else {
                    (Some(b), Some(b), None)
                }
            }
            (Some((m, true)), al) => {
                let mut a01 = im.emit(Op::Astype { dtype: dt }, vec![*m])?;
                if let Some(al) = al {
                    let s = static01(im, al)?;
                    a01 = im.emit(Op::Multiply, vec![a01, s])?;
                }
                let b = im.emit(Op::Log, vec![a01])?;
                let lo = im.scalar(-max, dt);
                let f = im.emit(Op::Maximum, vec![b, lo])?;
                let g = im.emit(keep(-1), vec![a01])?;
                (Some(b), Some(f), Some(g))
            }
            (Some((m, false)), al) => {
                let mut m = *m;
                let (_, mdt) = im.dims(m)?;
                if mdt != dt {
                    m = im.emit(Op::Astype { dtype: dt }, vec![m])?;
                }
                match al {
                    None => (Some(m), Some(m), None),
                    Some(al) => {
                        let sb = static_bias(im, al, false)?;
                        let b = im.emit(Op::Add, vec![m, sb])?;
                        if static_empty_row {
                            let sf = static_bias(im, al, true)?;
                            let f = im.emit(Op::Add, vec![m, sf])?;
                            let g = static_guard(im, al)?;
                            (Some(b), Some(f), Some(g))
                        } else {
                            (Some(b), Some(b), None)
                        }
                    }
                }
            }
        };
    let qk_out = scores;
    let with_bias = match bias {
        Some(b) => im.emit(Op::Add, vec![scores, b])?,
        None => scores,
    };
    let mut logits = match soft {
        Some(f) if Some(f) != bias => im.emit(Op::Add, vec![scores, f])?,
        _ => with_bias,
    };
    let precision = if a.has("softmax_precision") {
        super::super::dtype_of(a.int("softmax_precision", 1) as i32)
            .ok_or_else(|| invalid("Attention: softmax_precision names an unsupported type"))?
    } else {
        dt
    };
    if precision != dt {
        logits = im.emit(Op::Astype { dtype: precision }, vec![logits])?;
    }
    let mut probs = im.emit(Op::Softmax { axis: -1 }, vec![logits])?;
    if precision != dt {
        probs = im.emit(Op::Astype { dtype: dt }, vec![probs])?;
    }
    if let Some(g) = guard {
        probs = im.emit(Op::Multiply, vec![probs, g])?;
    }
    let mut y = im.emit(Op::Matmul { out_dtype: None }, vec![probs, v])?;
    if rank3 {
        let t = im.emit(
            Op::PermuteDims {
                axes: Some(vec![0, 2, 1, 3]),
            },
            vec![y],
        )?;
        let dv = stat(&vd[3], "value head size")?;
        let s = im.b.shape(vec![
            batch,
            Dim::Static(sq),
            Dim::Static(q_heads.saturating_mul(dv)),
        ]);
        y = im.emit(Op::Reshape, vec![t, s])?;
    }
    let qk = match a.int("qk_matmul_output_mode", 0) {
        0 | 1 => qk_out,
        2 => with_bias,
        3 => probs,
        m => {
            return Err(invalid(format!(
                "Attention: qk_matmul_output_mode {m} is not one of 0 to 3"
            )));
        }
    };
    Ok(vec![
        Out::Val(Val::Expr(y)),
        Out::Val(Val::Expr(present_k)),
        Out::Val(Val::Expr(present_v)),
        Out::Val(Val::Expr(qk)),
    ])
}

/// `x[..., begin:end:step]` on the last axis (`axis` 3 of a 4-D tensor).
fn slice_last(im: &mut Importer<'_>, x: ExprId, begin: i64, end: i64, step: i64) -> Result<ExprId> {
    im.emit(
        Op::StridedSlice(Box::new(crate::op::StridedSliceAttrs {
            axes: vec![3],
            begin: vec![begin],
            end: vec![end],
            strides: Some(vec![step]),
            assume_inbound: false,
        })),
        vec![x],
    )
}

/// ONNX `RotaryEmbedding` (opset 23) as a composition: the rotated part of each head is
/// split in halves (or in even / odd elements when `interleaved`), rotated by the cos / sin
/// caches (gathered by `position_ids` when given) and put back; the rest of the head passes
/// through. 3-D inputs `(batch, seq, heads * size)` need `num_heads`; 4-D inputs are
/// `(batch, heads, seq, size)`.
///
/// ```text
/// RotaryEmbedding(x, cos, sin, pos)  →  c = R.expand_dims(R.take(cos, pos, axis=0), axis=[2])
///                                       x1, x2 = the two halves of x[..., :rotary_dim]
///                                       y = concat(c * x1 - s * x2, s * x1 + c * x2, rest)
/// ```
pub(crate) fn rotary_embedding(
    im: &mut Importer<'_>,
    node: &super::super::NodeProto,
    a: &Attrs<'_>,
) -> Result<Vec<Out>> {
    let x0 = im.expr(req(node, 0)?)?;
    let (xd, _) = im.dims(x0)?;
    let x = match xd.len() {
        4 => im.emit(
            Op::PermuteDims {
                axes: Some(vec![0, 2, 1, 3]),
            },
            vec![x0],
        )?,
        3 => {
            let heads = a.int("num_heads", 0);
            let hidden = stat(&xd[2], "hidden size")?;
            if heads <= 0 || hidden % heads != 0 {
                return Err(invalid(format!(
                    "RotaryEmbedding with a 3-D input needs num_heads dividing the hidden size \
                     {hidden}, found {heads}"
                )));
            }
            let s = im.b.shape(vec![
                xd[0].clone(),
                xd[1].clone(),
                Dim::Static(heads),
                Dim::Static(hidden / heads),
            ]);
            im.emit(Op::Reshape, vec![x0, s])?
        }
        r => {
            return Err(invalid(format!(
                "RotaryEmbedding: the input must be 3-D or 4-D, found rank {r}"
            )));
        }
    };
    let (d4, _) = im.dims(x)?;
    let head = stat(&d4[3], "head size")?;
    let rd = match a.int("rotary_embedding_dim", 0) {
        0 => head,
        r if r > 0 && r <= head && r % 2 == 0 => r,
        r => {
            return Err(invalid(format!(
                "RotaryEmbedding: rotary_embedding_dim {r} must be even and at most the head \
                 size {head}"
            )));
        }
    };
    let half = rd / 2;
    let mut cs = Vec::new();
    for i in [1, 2] {
        let mut c = im.expr(req(node, i)?)?;
        if let Some(p) = input(node, 3) {
            let p = im.expr(p)?;
            c = im.take(c, 0, p)?;
        }
        let (cd, _) = im.dims(c)?;
        if cd.last().and_then(Dim::as_static) != Some(half) {
            return Err(invalid(format!(
                "RotaryEmbedding: the cos / sin caches must end in rotary_dim / 2 = {half}"
            )));
        }
        cs.push(im.emit(Op::ExpandDims { axis: vec![2] }, vec![c])?);
    }
    let (cos, sin) = (cs[0], cs[1]);
    let interleaved = a.int("interleaved", 0) != 0;
    let (x1, x2) = if interleaved {
        (slice_last(im, x, 0, rd, 2)?, slice_last(im, x, 1, rd, 2)?)
    } else {
        (
            slice_last(im, x, 0, half, 1)?,
            slice_last(im, x, half, rd, 1)?,
        )
    };
    let c1 = im.emit(Op::Multiply, vec![cos, x1])?;
    let s2 = im.emit(Op::Multiply, vec![sin, x2])?;
    let real = im.emit(Op::Subtract, vec![c1, s2])?;
    let s1 = im.emit(Op::Multiply, vec![sin, x1])?;
    let c2 = im.emit(Op::Multiply, vec![cos, x2])?;
    let imag = im.emit(Op::Add, vec![s1, c2])?;
    let mut rot = if interleaved {
        let r = im.emit(Op::ExpandDims { axis: vec![-1] }, vec![real])?;
        let i = im.emit(Op::ExpandDims { axis: vec![-1] }, vec![imag])?;
        let t = im.b.tuple(vec![r, i])?;
        let pairs = im.emit(Op::Concat { axis: Some(-1) }, vec![t])?;
        let s = im.b.shape(vec![
            d4[0].clone(),
            d4[1].clone(),
            d4[2].clone(),
            Dim::Static(rd),
        ]);
        im.emit(Op::Reshape, vec![pairs, s])?
    } else {
        let t = im.b.tuple(vec![real, imag])?;
        im.emit(Op::Concat { axis: Some(3) }, vec![t])?
    };
    if rd < head {
        let rest = slice_last(im, x, rd, head, 1)?;
        let t = im.b.tuple(vec![rot, rest])?;
        rot = im.emit(Op::Concat { axis: Some(3) }, vec![t])?;
    }
    if xd.len() == 4 {
        return Ok(super::call(
            Op::PermuteDims {
                axes: Some(vec![0, 2, 1, 3]),
            },
            vec![rot],
        ));
    }
    let s = im.b.shape(xd);
    Ok(super::call(Op::Reshape, vec![rot, s]))
}

/// The most time steps `LinearAttention` unrolls.
const MAX_STEPS: i64 = 1024;

/// `x[:, :, i:i + 1, :]` of a 4-D tensor.
fn step(im: &mut Importer<'_>, x: ExprId, i: i64) -> Result<ExprId> {
    im.emit(
        Op::StridedSlice(Box::new(crate::op::StridedSliceAttrs {
            axes: vec![2],
            begin: vec![i],
            end: vec![i + 1],
            strides: None,
            assume_inbound: false,
        })),
        vec![x],
    )
}

/// `x` as float32 (a no-op for float32).
fn as_f32(im: &mut Importer<'_>, x: ExprId) -> Result<ExprId> {
    let (_, dt) = im.dims(x)?;
    if dt == DType::F32 {
        Ok(x)
    } else {
        im.emit(Op::Astype { dtype: DType::F32 }, vec![x])
    }
}

/// ONNX `LinearAttention` (opset 27) unrolled over its (static) time steps, in float32 as
/// ONNX's reference: per step the state `(batch, kv_heads, d_k, d_v)` decays by `exp(decay)`
/// (`gated`, `gated_delta`), the value is corrected by `beta * (v - k @ state)` (`delta`,
/// `gated_delta`), the state adds `kᵀ v`, and the output reads `scale * q @ state` with the
/// KV heads repeated for the query heads. Returns the output `(batch, T, q_heads * d_v)` and
/// the final state (in `past_state`'s dtype, else the query's).
///
/// ```text
/// per step t:  S = S * exp(g_t)ᵀ;  v_t = β_t (v_t - k_t @ S);  S = S + k_tᵀ * v_t;
///              o_t = scale * (q_t @ repeat(S))
/// ```
pub(crate) fn linear_attention(
    im: &mut Importer<'_>,
    node: &super::super::NodeProto,
    a: &Attrs<'_>,
) -> Result<Vec<Out>> {
    let rule = a.string("update_rule", "gated_delta");
    let (gating, delta) = match rule.as_str() {
        "linear" => (false, false),
        "gated" => (true, false),
        "delta" => (false, true),
        "gated_delta" => (true, true),
        other => {
            return Err(invalid(format!(
                "LinearAttention: unknown update_rule `{other}` (expected linear, gated, delta \
                 or gated_delta)"
            )));
        }
    };
    let (qh, kvh) = (a.int("q_num_heads", 0), a.int("kv_num_heads", 0));
    if qh <= 0 || kvh <= 0 || qh % kvh != 0 {
        return Err(invalid(format!(
            "LinearAttention: q_num_heads ({qh}) must be a positive multiple of kv_num_heads \
             ({kvh})"
        )));
    }
    let decay_in = input(node, 4);
    let beta_in = input(node, 5);
    if gating != decay_in.is_some() || delta != beta_in.is_some() {
        return Err(invalid(format!(
            "LinearAttention: update_rule `{rule}` {} decay and {} beta",
            if gating { "needs" } else { "forbids" },
            if delta { "needs" } else { "forbids" }
        )));
    }
    let q0 = im.expr(req(node, 0)?)?;
    let (qd, out_dt) = im.dims(q0)?;
    for i in 0..3 {
        let e = im.expr(req(node, i)?)?;
        if im.dims(e)?.0.len() != 3 {
            return Err(invalid("LinearAttention: query, key and value must be 3-D"));
        }
    }
    let t = stat(&qd[1], "sequence length")?;
    if t > MAX_STEPS {
        return Err(invalid(format!(
            "LinearAttention: {t} time steps are more than the {MAX_STEPS} this import unrolls"
        )));
    }
    let mut heads = Vec::new();
    for (i, h, what) in [(0, qh, "query"), (1, kvh, "key"), (2, kvh, "value")] {
        let e = im.expr(req(node, i)?)?;
        let e = split_heads(im, e, h, what)?;
        heads.push(as_f32(im, e)?);
    }
    let (q, k, v) = (heads[0], heads[1], heads[2]);
    let (kd, _) = im.dims(k)?;
    let (vd, _) = im.dims(v)?;
    let batch = kd[0].clone();
    let dk = stat(&kd[3], "key head size")?;
    let dv = stat(&vd[3], "value head size")?;
    let decay = match decay_in {
        Some(n) => {
            let e = im.expr(n)?;
            let (dd, _) = im.dims(e)?;
            let last = dd.last().map(|d| stat(d, "decay size")).transpose()?;
            if dd.len() != 3 || (last != Some(kvh) && last != Some(kvh.saturating_mul(dk))) {
                return Err(invalid(
                    "LinearAttention: decay must be (batch, T, kv_heads) or (batch, T, \
                     kv_heads * d_k)",
                ));
            }
            let e = split_heads(im, e, kvh, "decay")?;
            Some(as_f32(im, e)?)
        }
        None => None,
    };
    let beta = match beta_in {
        Some(n) => {
            let e = im.expr(n)?;
            let (bd, _) = im.dims(e)?;
            let last = bd.last().map(|d| stat(d, "beta size")).transpose()?;
            let Some(hb) = last.filter(|&l| bd.len() == 3 && (l == kvh || l == 1)) else {
                return Err(invalid(
                    "LinearAttention: beta must be (batch, T, kv_heads) or (batch, T, 1)",
                ));
            };
            let e = split_heads(im, e, hb, "beta")?;
            Some(as_f32(im, e)?)
        }
        None => None,
    };
    let (mut state, state_dt) = match input(node, 3) {
        Some(n) => {
            let e = im.expr(n)?;
            let (sd, sdt) = im.dims(e)?;
            let want = [
                batch.clone(),
                Dim::Static(kvh),
                Dim::Static(dk),
                Dim::Static(dv),
            ];
            if sd.as_slice() != want.as_slice() {
                return Err(invalid(format!(
                    "LinearAttention: past_state must be (batch, kv_heads, d_k, d_v) = \
                     ({}, {kvh}, {dk}, {dv})",
                    batch
                )));
            }
            (Some(as_f32(im, e)?), sdt)
        }
        None => (None, out_dt),
    };
    let given = a.float("scale", 0.0);
    let scale = if given == 0.0 {
        1.0 / (dk as f64).sqrt()
    } else {
        given
    };
    let sc = im.scalar(scale, DType::F32);
    let t_last = |im: &mut Importer<'_>, x: ExprId| {
        im.emit(
            Op::PermuteDims {
                axes: Some(vec![0, 1, 3, 2]),
            },
            vec![x],
        )
    };
    let group = qh / kvh;
    let mut outs = Vec::new();
    for i in 0..t {
        let q_t = step(im, q, i)?;
        let k_t = step(im, k, i)?;
        let mut v_t = step(im, v, i)?;
        if let (Some(g), Some(s)) = (decay, state) {
            let g_t = step(im, g, i)?;
            let e = im.emit(Op::Exp, vec![g_t])?;
            let et = t_last(im, e)?;
            state = Some(im.emit(Op::Multiply, vec![s, et])?);
        }
        if let Some(b) = beta {
            let b_t = step(im, b, i)?;
            let d = match state {
                Some(s) => {
                    let r = im.emit(Op::Matmul { out_dtype: None }, vec![k_t, s])?;
                    im.emit(Op::Subtract, vec![v_t, r])?
                }
                None => v_t,
            };
            v_t = im.emit(Op::Multiply, vec![b_t, d])?;
        }
        let kt = t_last(im, k_t)?;
        let outer = im.emit(Op::Multiply, vec![kt, v_t])?;
        let s = match state {
            Some(s) => im.emit(Op::Add, vec![s, outer])?,
            None => outer,
        };
        state = Some(s);
        let read = if group == 1 {
            s
        } else {
            let x = im.emit(Op::ExpandDims { axis: vec![2] }, vec![s])?;
            let wide = im.b.shape(vec![
                batch.clone(),
                Dim::Static(kvh),
                Dim::Static(group),
                Dim::Static(dk),
                Dim::Static(dv),
            ]);
            let b = im.emit(Op::BroadcastTo, vec![x, wide])?;
            let sh = im.b.shape(vec![
                batch.clone(),
                Dim::Static(qh),
                Dim::Static(dk),
                Dim::Static(dv),
            ]);
            im.emit(Op::Reshape, vec![b, sh])?
        };
        let o = im.emit(Op::Matmul { out_dtype: None }, vec![q_t, read])?;
        outs.push(im.emit(Op::Multiply, vec![o, sc])?);
    }
    let Some(state) = state else {
        return Err(invalid("LinearAttention needs at least one time step"));
    };
    let all = if outs.len() == 1 {
        outs[0]
    } else {
        let tup = im.b.tuple(outs)?;
        im.emit(Op::Concat { axis: Some(2) }, vec![tup])?
    };
    let tr = im.emit(
        Op::PermuteDims {
            axes: Some(vec![0, 2, 1, 3]),
        },
        vec![all],
    )?;
    let sh = im.b.shape(vec![
        batch,
        Dim::Static(t),
        Dim::Static(qh.saturating_mul(dv)),
    ]);
    let mut y = im.emit(Op::Reshape, vec![tr, sh])?;
    if out_dt != DType::F32 {
        y = im.emit(Op::Astype { dtype: out_dt }, vec![y])?;
    }
    let present = if state_dt != DType::F32 {
        im.emit(Op::Astype { dtype: state_dt }, vec![state])?
    } else {
        state
    };
    Ok(vec![Out::Val(Val::Expr(y)), Out::Val(Val::Expr(present))])
}
