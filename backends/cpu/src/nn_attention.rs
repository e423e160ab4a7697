//! `relax.nn.attention(q, k, v)` / `relax.nn.attention_bias(q, k, v, bias)`: TVM's op on the
//! online-softmax attention of [`crate::attention`].
//!
//! Contract: `q (B, Sq, N, H)`, `k (B, Skv, Nk, H)`, `v (B, Skv, Nv, Hv)` (BSNH, TVM's layout),
//! result `(B, Sq, N, Hv)` in q's dtype; `bias` (rank 4) broadcasts to `(B, N, Sq, Skv)`.
//! Per (batch, query head `h`): `softmax(q·kᵀ·scale + bias, masked) · v` with key/value head
//! `h / (N / Nk)` (grouped-query heads), `scale` defaulting to `1 / sqrt(H)`, and the causal
//! mask hiding key `j` from query `i` when `j > i + offset` (`TopLeft`: 0; `BottomRight`:
//! `|Sq - Skv|`, TVM's legalization). float32 runs as is; float16, bfloat16 and float64 are
//! converted to float32 and the result back (accumulation in f32). A row whose keys a `-inf`
//! bias hides entirely gives NaN, as the materialised softmax does. `window_size` is an
//! error, as in TVM's legalization (only flash attention implements it). Every other bad
//! input (ranks, dims, dtypes) is an error saying what was expected.
//!
//! ```text
//! y = R.nn.attention(q, k, v, scale=None, causal_mask="BottomRight", window_size=None)
//! # q: (1, 3, 4, 8) f16, k, v: (1, 5, 2, 8) f16 -> q, k, v to f32, transposed to (B, N, S, H),
//! # kᵀ (B, Nk, H, Skv); attention(q / sqrt(8), kᵀ, v, causal offset 2); back to (B, S, N, H) f16
//! ```

use crate::attention::{AttnSpec, Causal, Scale, attention as online_attention};
use fusebox_core::ir::DType;
use fusebox_core::op::AttentionAttrs;
use fusebox_core::runtime::Tensor;

/// `(a, b, c, d)` → `(a, c, b, d)`, or with `keys_transposed` `(a, c, d, b)`: the BSNH operands to
/// the `[batch, head, rows, cols]` order the online attention takes.
fn permute(x: &[f32], s: [usize; 4], keys_transposed: bool) -> Vec<f32> {
    let [a, b, c, d] = s;
    let mut out = vec![0.0f32; x.len()];
    for ia in 0..a {
        for ib in 0..b {
            for ic in 0..c {
                let src = &x[((ia * b + ib) * c + ic) * d..][..d];
                for (id, &val) in src.iter().enumerate() {
                    let o = if keys_transposed {
                        ((ia * c + ic) * d + id) * b + ib
                    } else {
                        ((ia * c + ic) * b + ib) * d + id
                    };
                    out[o] = val;
                }
            }
        }
    }
    out
}

fn dims4(t: &Tensor, what: &str) -> Result<[usize; 4], String> {
    <[usize; 4]>::try_from(t.shape()).map_err(|_| {
        format!(
            "expected the {what} to have 4 dimensions (batch, seq_len, num_heads, head_dim), found shape {:?}",
            t.shape()
        )
    })
}

/// Runs the op (see the module doc).
pub(crate) fn attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    bias: Option<&Tensor>,
    a: &AttentionAttrs,
) -> Result<Tensor, String> {
    if let Some(w) = a.window_size {
        return Err(format!(
            "window_size={w}: sliding-window attention has no reference kernel (TVM's \
             legalization does not support it either; only its flash-attention path does)"
        ));
    }
    let dtype = q.dtype();
    if !matches!(dtype, DType::F32 | DType::F16 | DType::BF16 | DType::F64) {
        return Err(format!(
            "the query is {dtype}; attention takes float32, float16, bfloat16 or float64"
        ));
    }
    for (t, what) in [(Some(k), "key"), (Some(v), "value"), (bias, "bias")] {
        if let Some(t) = t
            && t.dtype() != dtype
        {
            return Err(format!(
                "the {what} is {}, the query {dtype}: the operands must share one dtype",
                t.dtype()
            ));
        }
    }
    let [b, sq, n, h] = dims4(q, "query")?;
    let [kb, skv, nk, kh] = dims4(k, "key")?;
    let [vb, vs, nv, hv] = dims4(v, "value")?;
    if kb != b || vb != b {
        return Err(format!(
            "the batch sizes differ: query {b}, key {kb}, value {vb}"
        ));
    }
    if kh != h {
        return Err(format!(
            "the query's head dim is {h}, the key's {kh}: they must be equal"
        ));
    }
    if vs != skv {
        return Err(format!(
            "the key's sequence length is {skv}, the value's {vs}: they must be equal"
        ));
    }
    for (m, what) in [(nk, "key"), (nv, "value")] {
        if m == 0 || !n.is_multiple_of(m) {
            return Err(format!(
                "the query's {n} heads are not a multiple of the {what}'s {m}"
            ));
        }
    }
    if let Some(bt) = bias {
        let bs = dims4(bt, "bias").map_err(|_| {
            format!(
                "expected the bias to have 4 dimensions broadcasting to (batch, heads, seq_len, seq_len_kv) = {:?}, found shape {:?}",
                [b, n, sq, skv],
                bt.shape()
            )
        })?;
        let full = [b, n, sq, skv];
        if (0..3).any(|i| bs[i] != full[i] && bs[i] != 1) || bs[3] != skv {
            return Err(format!(
                "the bias of shape {bs:?} does not broadcast to (batch, heads, seq_len, seq_len_kv) = {full:?} (its last dim must be seq_len_kv)"
            ));
        }
    }
    let out_shape = vec![b, sq, n, hv];
    // (The result's size was checked against the memory limit before the call.)
    if [b, sq, n, hv].contains(&0) {
        return Tensor::zeros(out_shape, dtype).map_err(|e| e.to_string());
    }
    if skv == 0 {
        return Err("the key sequence is empty: the softmax of an empty row is undefined".into());
    }
    let f32_of = |t: &Tensor| -> Vec<f32> {
        match t.as_f32() {
            Some(x) => x.to_vec(),
            None => t.to_f32_vec(),
        }
    };
    // [B, N, Sq, H], [B, Nk, H, Skv] (kᵀ), [B, Nv, Skv, Hv].
    let qt = Tensor::from_f32(vec![b, n, sq, h], permute(&f32_of(q), [b, sq, n, h], false))
        .map_err(|e| e.to_string())?;
    let kt = Tensor::from_f32(
        vec![b, nk, h, skv],
        permute(&f32_of(k), [b, skv, nk, h], true),
    )
    .map_err(|e| e.to_string())?;
    let vt = Tensor::from_f32(
        vec![b, nv, skv, hv],
        permute(&f32_of(v), [b, skv, nv, hv], false),
    )
    .map_err(|e| e.to_string())?;
    let bias32 = match bias {
        Some(t) if t.dtype() != DType::F32 => Some(t.cast(DType::F32)),
        Some(t) => Some(t.clone()),
        None => None,
    };
    let masks: Vec<&Tensor> = bias32.iter().collect();
    let q_scale = match a.scale {
        Some(s) => Scale::Mul(s.0 as f32),
        None => Scale::Div((h as f32).sqrt()),
    };
    let spec = AttnSpec {
        q_scale,
        k_scale: Scale::None,
        nan_guard: false,
        causal: a.causal_mask.map(|c| Causal::Offset(c.offset(sq, skv))),
    };
    let o = online_attention(&qt, &kt, &vt, &masks, None, &spec)?.ok_or_else(|| {
        format!(
            "attention of q {:?}, k {:?}, v {:?} is not a shape the kernel takes",
            q.shape(),
            k.shape(),
            v.shape()
        )
    })?;
    let od = o
        .as_f32()
        .ok_or("the attention kernel returned a non-f32 tensor")?;
    let out = Tensor::from_f32(out_shape, permute(od, [b, n, sq, hv], false))
        .map_err(|e| e.to_string())?;
    Ok(if dtype == DType::F32 {
        out
    } else {
        out.cast(dtype)
    })
}
