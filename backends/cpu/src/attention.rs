//! Scaled dot-product attention with an online softmax: the scores of one block of query rows
//! against one block of keys at a time, never the whole `[.., S, T]` score matrix.
//!
//! Contract: [`attention`] computes, for `q: [..., S, D]`, `kt: [..., D, T]` (the keys already
//! transposed, as the exporters' graphs have them) and `v: [..., T, Dv]`,
//!
//! ```text
//! p   = softmax(scale_q(q) @ scale_k(kt) + m1 + m2 …, axis=-1)  (masks: broadcast to [..., S, T])
//! out = (nan_guard ? where(isnan(p), 0, p) : p) @ v             [..., S, Dv]
//! ```
//!
//! with `causal` also masking key `j > i + offset` to `-inf` (the exporters' end-aligned mask
//! is `offset = T - S`). The leading (batch, head) dims
//! broadcast as `matmul`'s do; where `kt`/`v` have fewer heads than `q` (grouped-query
//! attention, the head dim just before the matrix dims), query head `h` reads key/value head
//! `h / (Hq / Hkv)`. Scales are applied in `f32` exactly as the graph's `multiply`/`divide`.
//! `Ok(None)` for shapes it does not handle (the caller interprets the body then); `Err` only
//! for shapes no graph could have. Each output row is computed by one sequential loop, so the
//! result is the same for every thread count.

use crate::util::{broadcast_shapes, broadcast_strides};
use faer::{Accum, MatMut, MatRef, Par};

/// A scalar applied to `q` or `kt` before the product.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Scale {
    /// None.
    None,
    /// `x * c`.
    Mul(f32),
    /// `x / c`.
    Div(f32),
}

impl Scale {
    #[inline]
    fn apply(self, x: f32) -> f32 {
        match self {
            Scale::None => x,
            Scale::Mul(c) => x * c,
            Scale::Div(c) => x / c,
        }
    }
}

/// What the attention computes besides the products.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct AttnSpec {
    /// Applied to `q`.
    pub q_scale: Scale,
    /// Applied to `kt`.
    pub k_scale: Scale,
    /// `where(isnan(p), 0, p)` after the softmax: a row whose softmax is NaN gives zeros.
    pub nan_guard: bool,
    /// The causal mask, if any.
    pub causal: Option<Causal>,
}

/// Which keys a causal mask hides from query `i`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Causal {
    /// Key `j` is hidden when `j > i + offset` (`relax.nn.attention`'s `causal_mask`).
    Offset(usize),
}

/// Keys per block: all keys in one block up to [`BK_MAX`] (no rescaling of the running sums),
/// else blocks of [`BK`].
const BK: usize = 256;
const BK_MAX: usize = 1024;

/// Query rows per task: as many as keep a task's scores within `SCORES` floats (256 KiB,
/// in a core's L2 with the key block), between 32 and 128, a multiple of 8. It depends on the
/// shape only (so the result does not depend on the thread count); more rows per task make
/// the two GEMMs of a task larger, and the key block is scaled once per task.
fn rows_per_task(t: usize) -> usize {
    const SCORES: usize = 1 << 16;
    let bk = if t <= BK_MAX { t.max(1) } else { BK };
    (SCORES / bk).clamp(32, 128) / 8 * 8
}

/// Where one input's matrix starts for each output batch index (`out`: the batch dims, row
/// major): a dim equal to the output's is indexed as is, a dim of 1 broadcasts, and the head
/// dim (`heads`) may group (`out[h] % dims[h] == 0`: query head `i` reads `i / group`).
fn batch_offsets(dims: &[usize], out: &[usize], heads: Option<usize>, elems: usize) -> Vec<usize> {
    let mut strides = vec![0usize; dims.len()];
    let mut acc = 1;
    for k in (0..dims.len()).rev() {
        strides[k] = acc;
        acc *= dims[k];
    }
    let n: usize = out.iter().product();
    let mut offs = Vec::with_capacity(n);
    let mut idx = vec![0usize; out.len()];
    for _ in 0..n {
        let mut o = 0usize;
        for k in 0..out.len() {
            let i = if dims[k] == out[k] {
                idx[k]
            } else if dims[k] == 1 {
                0
            } else if Some(k) == heads {
                idx[k] / (out[k] / dims[k])
            } else {
                0
            };
            o += i * strides[k];
        }
        offs.push(o * elems);
        crate::util::next_index(&mut idx, out);
    }
    offs
}

/// See the module docs.
pub(crate) fn attention(
    q: &fusebox_core::runtime::Tensor,
    kt: &fusebox_core::runtime::Tensor,
    v: &fusebox_core::runtime::Tensor,
    masks: &[&fusebox_core::runtime::Tensor],
    spec: &AttnSpec,
) -> Result<Option<fusebox_core::runtime::Tensor>, String> {
    let (Some(qd), Some(kd), Some(vd)) = (q.as_f32(), kt.as_f32(), v.as_f32()) else {
        return Ok(None);
    };
    let (qs, ks, vs) = (q.shape(), kt.shape(), v.shape());
    let r = qs.len();
    if r < 2 || ks.len() != r || vs.len() != r {
        return Ok(None);
    }
    let (s, d) = (qs[r - 2], qs[r - 1]);
    let (kd0, t) = (ks[r - 2], ks[r - 1]);
    let (t2, dv) = (vs[r - 2], vs[r - 1]);
    if kd0 != d || t2 != t {
        return Err(format!(
            "q {qs:?}, kᵀ {ks:?} and v {vs:?} do not chain as [.., S, D] @ [.., D, T] @ [.., T, Dv]"
        ));
    }
    let bq = &qs[..r - 2];
    // Batch dims: q's, with k and v broadcasting or grouping into them.
    let heads = (r >= 3).then(|| r - 3);
    let fits = |x: &[usize]| {
        x.iter()
            .zip(bq)
            .enumerate()
            .all(|(k, (&a, &b))| a == b || a == 1 || (Some(k) == heads && a != 0 && b % a == 0))
    };
    if !fits(&ks[..r - 2]) || !fits(&vs[..r - 2]) {
        return Ok(None);
    }
    let nb: usize = bq.iter().product();
    let q_off: Vec<usize> = (0..nb).map(|b| b * s * d).collect();
    let k_off = batch_offsets(&ks[..r - 2], bq, heads, d * t);
    let v_off = batch_offsets(&vs[..r - 2], bq, heads, t * dv);
    // The mask, broadcast to [batch.., S, T]: per-batch offset and row/column strides.
    let mut score_shape = bq.to_vec();
    score_shape.extend([s, t]);
    let mut mask_data = Vec::with_capacity(masks.len());
    for m in masks {
        let Some(md) = m.as_f32() else {
            return Ok(None);
        };
        if m.rank() > score_shape.len()
            || broadcast_shapes(m.shape(), &score_shape).ok().as_deref() != Some(&score_shape)
        {
            return Ok(None);
        }
        let st = broadcast_strides(m.shape(), &score_shape);
        let (rs, cs) = (st[r - 2], st[r - 1]);
        // Per batch index: the offset of [b, 0, 0].
        let mut offs = Vec::with_capacity(nb);
        let mut idx = vec![0usize; r - 2];
        for _ in 0..nb {
            let o: isize = idx.iter().zip(&st).map(|(&i, &x)| i as isize * x).sum();
            offs.push(o);
            crate::util::next_index(&mut idx, bq);
        }
        mask_data.push((md, offs, rs, cs));
    }
    let n_out = nb
        .checked_mul(s)
        .and_then(|x| x.checked_mul(dv))
        .ok_or("the output's size overflows")?;
    let threads = crate::par::threads_for(nb * s * t * (d + dv), 1 << 15);
    let mut out = crate::par::scratch_f32(n_out);
    // Tasks: (batch index, first row, rows) with their slice of the output.
    let mut tasks = Vec::new();
    if s * dv > 0 {
        for (b, chunk) in out.chunks_mut(s * dv).enumerate() {
            let bq = rows_per_task(t);
            for (qb, rows) in chunk.chunks_mut(bq * dv).enumerate() {
                tasks.push((b, qb * bq, rows));
            }
        }
    }
    let res: Result<(), ()> = crate::par::run_tasks(tasks, threads, |(b, i0, o)| {
        let rows = o.len() / dv.max(1);
        let qb = &qd[q_off[b] + i0 * d..q_off[b] + (i0 + rows) * d];
        let kb = &kd[k_off[b]..k_off[b] + d * t];
        let vb = &vd[v_off[b]..v_off[b] + t * dv];
        let mask_rows: Vec<Mask<'_>> = mask_data
            .iter()
            .map(|(md, offs, rs, cs)| (*md, offs[b], *rs, *cs))
            .collect();
        crate::simd::dispatch(Block {
            q: qb,
            kt: kb,
            v: vb,
            masks: &mask_rows,
            spec,
            geom: (i0, rows, s, t, d, dv),
            out: o,
        });
        Ok(())
    });
    debug_assert!(res.is_ok());
    let mut shape = bq.to_vec();
    shape.extend([s, dv]);
    out.into_tensor(shape).map(Some)
}

/// `e^x` in `f32`, branch-free so loops over it vectorise: Cephes' `expf` (range reduction by
/// `ln 2` in two parts, a degree-6 polynomial, the exponent put in by its bits; about 1 ulp).
/// `e^x` underflows to 0 below -87.3 (as `-inf` does), NaN stays NaN, and inputs above 88.3
/// are taken as 88.3 (the softmax only ever passes `x - max ≤ 0`).
#[inline(always)]
pub(crate) fn exp32(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // Round to nearest by the 1.5 * 2^23 trick (no libm call).
    const MAGIC: f32 = 12_582_912.0;
    let xc = x.clamp(-87.3, 88.3);
    let t = xc * LOG2E + MAGIC;
    let n = t - MAGIC;
    let r = xc - n * 0.693_359_4 - n * -2.121_944_4e-4;
    let mut y = 1.987_569_1e-4_f32;
    y = y * r + 1.398_2e-3;
    y = y * r + 8.333_452e-3;
    y = y * r + 4.166_579_6e-2;
    y = y * r + 0.166_666_65;
    y = y * r + 0.5;
    y = y * r * r + r + 1.0;
    // 2^n from `t`'s bits: `n` is `t`'s low mantissa bits less MAGIC's (an integer in
    // -126..=127 after the clamp), so no float-to-int conversion (which does not vectorise
    // well) is needed; the same bits as `((n as i32 + 127) as u32) << 23`.
    let scale = f32::from_bits(t.to_bits().wrapping_sub(MAGIC.to_bits()).wrapping_add(127) << 23);
    if x < -87.3 { 0.0 } else { y * scale }
}

/// The largest element of `row` (NaN ignored, as `f32::max` does; `-inf` when empty), as 8
/// interleaved running maxima, which vectorises.
#[inline(always)]
fn striped_max_f32(row: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; 8];
    let mut chunks = row.chunks_exact(8);
    for c in &mut chunks {
        for (a, &x) in acc.iter_mut().zip(c) {
            *a = a.max(x);
        }
    }
    for (a, &x) in acc.iter_mut().zip(chunks.remainder()) {
        *a = a.max(x);
    }
    acc.iter().copied().fold(f32::NEG_INFINITY, f32::max)
}

/// A mask's data, the offset of this batch index's `[0, 0]`, and its row and column strides.
type Mask<'a> = (&'a [f32], isize, isize, isize);

/// One block of query rows `i0..i0+rows` of one batch index, over all keys in blocks of `BK`,
/// compiled for the widest instruction set of this CPU ([`crate::simd::dispatch`]; the
/// result does not depend on it).
struct Block<'a> {
    q: &'a [f32],
    kt: &'a [f32],
    v: &'a [f32],
    masks: &'a [Mask<'a>],
    spec: &'a AttnSpec,
    /// `(i0, rows, s, t, d, dv)`.
    geom: (usize, usize, usize, usize, usize, usize),
    out: &'a mut [f32],
}

impl pulp::WithSimd for Block<'_> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) {
        let Block {
            q,
            kt,
            v,
            masks,
            spec,
            geom,
            out,
        } = self;
        block(q, kt, v, masks, spec, geom, out);
    }
}

#[allow(clippy::too_many_arguments, reason = "the block's inputs and geometry")]
#[inline(always)]
fn block(
    q: &[f32],
    kt: &[f32],
    v: &[f32],
    masks: &[Mask<'_>],
    spec: &AttnSpec,
    (i0, rows, _, t, d, dv): (usize, usize, usize, usize, usize, usize),
    out: &mut [f32],
) {
    // Scaled query rows (the rows themselves without a scale).
    let qs: std::borrow::Cow<'_, [f32]> = match spec.q_scale {
        Scale::None => q.into(),
        sc => q.iter().map(|&x| sc.apply(x)).collect::<Vec<f32>>().into(),
    };
    let mut m = vec![f32::NEG_INFINITY; rows];
    let mut l = vec![0.0f32; rows];
    out.iter_mut().for_each(|x| *x = 0.0);
    let bk = if t <= BK_MAX { t.max(1) } else { BK };
    let scaled_k = spec.k_scale != Scale::None;
    let mut kblk = vec![0.0f32; if scaled_k { d * bk } else { 0 }];
    let mut sc = vec![0.0f32; rows * bk];
    let mut j0 = 0;
    while j0 < t {
        let w = bk.min(t - j0);
        // The key block, [d, w]: scaled into `kblk`, or columns j0.. of `kt` in place.
        let kb = if scaled_k {
            for dd in 0..d {
                let src = &kt[dd * t + j0..dd * t + j0 + w];
                for (dst, &x) in kblk[dd * w..dd * w + w].iter_mut().zip(src) {
                    *dst = spec.k_scale.apply(x);
                }
            }
            MatRef::from_row_major_slice(&kblk[..d * w], d, w)
        } else if d == 0 {
            MatRef::from_row_major_slice(&kblk[..0], 0, w)
        } else {
            MatRef::from_row_major_slice_with_stride(&kt[j0..(d - 1) * t + j0 + w], d, w, t)
        };
        // Scores of the block, [rows, w]: one sequential faer GEMM.
        let sc = &mut sc[..rows * w];
        faer::linalg::matmul::matmul(
            MatMut::from_row_major_slice_mut(sc, rows, w),
            Accum::Replace,
            MatRef::from_row_major_slice(&qs, rows, d),
            kb,
            1.0f32,
            Par::Seq,
        );
        for (r, sc) in sc.chunks_mut(w).enumerate() {
            let i = i0 + r;
            for &(md, off, rs, cs) in masks {
                let base = off + i as isize * rs + j0 as isize * cs;
                match cs {
                    1 => {
                        let row = &md[base as usize..base as usize + w];
                        for (x, &mv) in sc.iter_mut().zip(row) {
                            *x += mv;
                        }
                    }
                    0 => {
                        let mv = md[base as usize];
                        sc.iter_mut().for_each(|x| *x += mv);
                    }
                    _ => {
                        for (jj, x) in sc.iter_mut().enumerate() {
                            *x += md[(base + jj as isize * cs) as usize];
                        }
                    }
                }
            }
            if let Some(c) = spec.causal {
                // Key j is visible to query i when j <= i + offset.
                let Causal::Offset(o) = c;
                let limit = i.saturating_add(o);
                for (jj, x) in sc.iter_mut().enumerate() {
                    if j0 + jj > limit {
                        *x = f32::NEG_INFINITY;
                    }
                }
            }
            let bmax = striped_max_f32(sc);
            let m_new = m[r].max(bmax);
            if m_new == f32::NEG_INFINITY {
                // Everything so far masked out: these keys weigh nothing.
                sc.iter_mut().for_each(|x| *x = 0.0);
                continue;
            }
            let corr = exp32(m[r] - m_new);
            if corr != 1.0 {
                l[r] *= corr;
                out[r * dv..r * dv + dv].iter_mut().for_each(|x| *x *= corr);
            }
            sc.iter_mut().for_each(|x| *x = exp32(*x - m_new));
            l[r] += crate::simd::striped_sum(sc, |x| x);
            m[r] = m_new;
        }
        // out[rows, dv] += p[rows, w] @ v[j0..j0 + w, dv].
        faer::linalg::matmul::matmul(
            MatMut::from_row_major_slice_mut(&mut *out, rows, dv),
            Accum::Add,
            MatRef::from_row_major_slice(sc, rows, w),
            MatRef::from_row_major_slice(&v[j0 * dv..(j0 + w) * dv], w, dv),
            1.0f32,
            Par::Seq,
        );
        j0 += w;
    }
    for r in 0..rows {
        let orow = &mut out[r * dv..r * dv + dv];
        let inv = 1.0 / l[r];
        let bad = !l[r].is_finite() || l[r] == 0.0 || m[r] == f32::NEG_INFINITY;
        if bad && spec.nan_guard {
            orow.iter_mut().for_each(|x| *x = 0.0);
        } else if bad {
            orow.iter_mut().for_each(|x| *x = f32::NAN);
        } else {
            orow.iter_mut().for_each(|x| *x *= inv);
        }
    }
}
