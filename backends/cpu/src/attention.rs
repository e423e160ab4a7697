//! Scaled dot-product attention with an online softmax: the scores of one block of query rows
//! against one block of keys at a time, never the whole `[.., S, T]` score matrix.
//!
//! Contract: [`attention`] computes, for `q: [..., S, D]`, `kt: [..., D, T]` (the keys already
//! transposed, as the exporters' graphs have them) and `v: [..., T, Dv]`,
//!
//! ```text
//! s   = scale_q(q) @ scale_k(kt) + m1 + m2 …        (masks: broadcast to [..., S, T])
//! p   = softmax(select ? where(cond, fill, s) : s, axis=-1)  (cond: bool, broadcast the same,
//!                                                            or over a view of the scores)
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
//!
//! [`attention_permuted`] takes `q`, `kt` and `v` each as a `permute_dims` of a tensor in
//! memory and writes the result permuted, without copying any of them: the exporters' heads'
//! transposes (`cpu.attention_heads`) are read and written in place, as strided matrices.
//!
//! ```text
//! q: [B, S, H, D]  k: [B, T, H, D]  v: [B, T, H, Dv]     ; the projections, reshaped
//! attention_permuted(q [0,2,1,3], k [0,2,3,1], v [0,2,1,3], out [0,2,1,3]) : [B, S, H, Dv]
//! ; = permute_dims(attention(permute_dims(q, ..), permute_dims(k, ..), permute_dims(v, ..)), ..)
//! ```

use crate::util::{broadcast_shapes, broadcast_strides};
use faer::reborrow::ReborrowMut;
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
/// in a core's L2 with the key block), between 32 and 256, a multiple of 8. It depends on the
/// shape only (so the result does not depend on the thread count); more rows per task make
/// the two GEMMs of a task larger, and the key block is scaled once per task. Up to 256 so
/// that ViT's 197 tokens are one task per head (a cap of 128 split each head in two, which
/// scaled every key block twice: ViT-base's attention took 1.09 ms a layer on two threads,
/// 0.95 ms with this cap and the reused buffers of [`Bufs`]).
fn rows_per_task(t: usize) -> usize {
    const SCORES: usize = 1 << 16;
    let bk = if t <= BK_MAX { t.max(1) } else { BK };
    (SCORES / bk).clamp(32, 256) / 8 * 8
}

/// Where one input's matrix starts for each output batch index (`out`: the batch dims, row
/// major), from the input's batch `dims` and their `strides`: a dim equal to the output's is
/// indexed as is, a dim of 1 broadcasts, and the head dim (`heads`) may group
/// (`out[h] % dims[h] == 0`: query head `i` reads `i / group`).
fn batch_offsets(
    dims: &[usize],
    strides: &[usize],
    out: &[usize],
    heads: Option<usize>,
) -> Vec<usize> {
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
        offs.push(o);
        crate::util::next_index(&mut idx, out);
    }
    offs
}

/// An operand as the graph's `permute_dims` would give it, without the copy: `t`'s dims in
/// the order `perm` names (dim `i` is `t`'s dim `perm[i]`, as `permute_dims(t, axes=perm)`);
/// `None` is `t` as it is.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Operand<'a> {
    /// The tensor in memory.
    pub t: &'a fusebox_core::runtime::Tensor,
    /// The permutation applied to it, if any.
    pub perm: Option<&'a [usize]>,
}

impl<'a> Operand<'a> {
    /// `t` as it is.
    pub(crate) fn plain(t: &'a fusebox_core::runtime::Tensor) -> Self {
        Operand { t, perm: None }
    }

    /// The permuted shape and each of its dims' strides in `t`'s elements; `None` when `perm`
    /// is not a permutation of `t`'s dims.
    fn view(&self) -> Option<(Vec<usize>, Vec<usize>)> {
        let shape = self.t.shape();
        let st = crate::util::strides(shape);
        match self.perm {
            None => Some((shape.to_vec(), st)),
            Some(p) => is_permutation(p, shape.len()).then(|| {
                (
                    p.iter().map(|&k| shape[k]).collect(),
                    p.iter().map(|&k| st[k]).collect(),
                )
            }),
        }
    }
}

/// Whether `p` is a permutation of `0..r`.
fn is_permutation(p: &[usize], r: usize) -> bool {
    p.len() == r && (0..r).all(|i| p.contains(&i))
}

/// A strided matrix: element `(i, j)` at `data[i * rs + j * cs]` (`data` starts at `(0, 0)`).
#[derive(Clone, Copy)]
struct Strided<'a> {
    data: &'a [f32],
    rows: usize,
    cols: usize,
    rs: usize,
    cs: usize,
}

impl<'a> Strided<'a> {
    fn at(data: &'a [f32], off: usize, rows: usize, cols: usize, rs: usize, cs: usize) -> Self {
        Strided {
            data: data.get(off..).unwrap_or(&[]),
            rows,
            cols,
            rs,
            cs,
        }
    }

    /// Rows `i0..i0 + n`.
    fn rows(self, i0: usize, n: usize) -> Self {
        Strided::at(self.data, i0 * self.rs, n, self.cols, self.rs, self.cs)
    }

    /// Columns `j0..j0 + n`.
    fn cols(self, j0: usize, n: usize) -> Self {
        Strided::at(self.data, j0 * self.cs, self.rows, n, self.rs, self.cs)
    }

    /// A view for faer when one of the strides is 1 (or the matrix is empty).
    fn mat(self) -> Option<MatRef<'a, f32>> {
        if self.rows == 0 || self.cols == 0 {
            return Some(MatRef::from_row_major_slice(&[], self.rows, self.cols));
        }
        if self.cs == 1 {
            Some(MatRef::from_row_major_slice_with_stride(
                self.data, self.rows, self.cols, self.rs,
            ))
        } else if self.rs == 1 {
            Some(MatRef::from_column_major_slice_with_stride(
                self.data, self.rows, self.cols, self.cs,
            ))
        } else {
            None
        }
    }

    /// The matrix with `scale` applied, copied into `buf` in its own layout (column-major when
    /// its columns are contiguous in memory, so the copy reads whole runs), and viewed.
    /// Inlined into the SIMD-compiled block, so the runs' copies vectorise.
    #[inline(always)]
    fn scaled_into(self, scale: Scale, buf: &'a mut Vec<f32>) -> MatRef<'a, f32> {
        let (m, n) = (self.rows, self.cols);
        if m == 0 || n == 0 {
            return MatRef::from_row_major_slice(&[], m, n);
        }
        // Every element below is written: grown, never cleared (the buffer is reused).
        if buf.len() < m * n {
            buf.resize(m * n, 0.0);
        }
        let buf = &mut buf[..m * n];
        // Runs of `len` elements, `runs` of them `step` apart, into `buf` one after another.
        let col_major = self.rs == 1 && self.cs != 1;
        let (runs, len, step, inner) = if col_major {
            (n, m, self.cs, 1)
        } else {
            (m, n, self.rs, self.cs)
        };
        for (k, dst) in buf.chunks_exact_mut(len).enumerate() {
            let base = k * step;
            if inner == 1 {
                let src = &self.data[base..base + len];
                match scale {
                    Scale::None => dst.copy_from_slice(src),
                    Scale::Mul(c) => dst.iter_mut().zip(src).for_each(|(d, &x)| *d = x * c),
                    Scale::Div(c) => dst.iter_mut().zip(src).for_each(|(d, &x)| *d = x / c),
                }
            } else {
                for (j, d) in dst.iter_mut().enumerate() {
                    *d = scale.apply(self.data[base + j * inner]);
                }
            }
        }
        debug_assert_eq!(runs * len, buf.len());
        let buf: &'a [f32] = buf;
        if col_major {
            MatRef::from_column_major_slice(buf, m, n)
        } else {
            MatRef::from_row_major_slice(buf, m, n)
        }
    }

    /// The view, or (with a scale, or no unit stride) a scaled copy in `buf`.
    #[inline(always)]
    fn view_or_copy(self, scale: Scale, buf: &'a mut Vec<f32>) -> MatRef<'a, f32> {
        match (scale, self.mat()) {
            (Scale::None, Some(m)) => m,
            _ => self.scaled_into(scale, buf),
        }
    }
}

/// The select of `where(cond, fill, scores)` before the softmax: the `bool` condition, the
/// fill, and where the scores are viewed with other batch dims around it (DeBERTa reshapes its
/// `[B·H, S, T]` scores to `[B, H, S, T]` for the `[B, 1, S, T]` padding mask and back), the
/// view's batch dims: known sizes, and at most one `None` that takes what the others leave
/// of the scores' batch size (as reshape's `-1`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct SelectMask<'a> {
    /// The condition.
    pub cond: &'a fusebox_core::runtime::Tensor,
    /// The value where `cond` holds (finite or `-inf`).
    pub fill: f32,
    /// The batch dims the condition broadcasts against, when not the scores' own.
    pub view: Option<&'a [Option<usize>]>,
}

impl<'a> SelectMask<'a> {
    /// A condition broadcast against the scores as they are.
    #[cfg(test)]
    pub(crate) fn plain(cond: &'a fusebox_core::runtime::Tensor, fill: f32) -> Self {
        SelectMask {
            cond,
            fill,
            view: None,
        }
    }
}

/// A view's batch dims for `nb` batch indices: the known sizes, the unknown one (at most one)
/// `nb` over their product; `None` when they cannot have `nb` indices.
fn resolve_view(view: &[Option<usize>], nb: usize) -> Option<Vec<usize>> {
    let known = view
        .iter()
        .flatten()
        .try_fold(1usize, |a, &d| a.checked_mul(d))?;
    match view.iter().filter(|d| d.is_none()).count() {
        0 => (known == nb).then(|| view.iter().flatten().copied().collect()),
        1 if known > 0 && nb.is_multiple_of(known) => {
            Some(view.iter().map(|d| d.unwrap_or(nb / known)).collect())
        }
        _ => None,
    }
}

/// See the module docs.
pub(crate) fn attention(
    q: &fusebox_core::runtime::Tensor,
    kt: &fusebox_core::runtime::Tensor,
    v: &fusebox_core::runtime::Tensor,
    masks: &[&fusebox_core::runtime::Tensor],
    select: Option<SelectMask<'_>>,
    spec: &AttnSpec,
) -> Result<Option<fusebox_core::runtime::Tensor>, String> {
    attention_permuted(
        Operand::plain(q),
        Operand::plain(kt),
        Operand::plain(v),
        masks,
        select,
        spec,
        None,
    )
}

/// [`attention`] on permuted operands, its result permuted by `out_perm` (which must keep the
/// last dim last): `permute_dims(attention(permute_dims(q, pq), permute_dims(kt, pk),
/// permute_dims(v, pv)), out_perm)` without any of those copies. The heads' transposes the
/// exporters write around attention are read and written in place: `q`, `k` and `v` as the
/// projections left them (`[B, S, H, D]`), the output as the next projection takes it.
pub(crate) fn attention_permuted(
    q: Operand<'_>,
    kt: Operand<'_>,
    v: Operand<'_>,
    masks: &[&fusebox_core::runtime::Tensor],
    select: Option<SelectMask<'_>>,
    spec: &AttnSpec,
    out_perm: Option<&[usize]>,
) -> Result<Option<fusebox_core::runtime::Tensor>, String> {
    let (Some(qd), Some(kd), Some(vd)) = (q.t.as_f32(), kt.t.as_f32(), v.t.as_f32()) else {
        return Ok(None);
    };
    let (Some((qs, qst)), Some((ks, kst)), Some((vs, vst))) = (q.view(), kt.view(), v.view())
    else {
        return Ok(None);
    };
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
    // The output's dim order: the last stays last (each output row is one run).
    let po: Vec<usize> = match out_perm {
        None => (0..r).collect(),
        Some(p) => {
            if !is_permutation(p, r) || p[r - 1] != r - 1 {
                return Ok(None);
            }
            p.to_vec()
        }
    };
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
    let q_off = batch_offsets(bq, &qst[..r - 2], bq, None);
    let k_off = batch_offsets(&ks[..r - 2], &kst[..r - 2], bq, heads);
    let v_off = batch_offsets(&vs[..r - 2], &vst[..r - 2], bq, heads);
    // The mask, broadcast to [batch.., S, T]: per-batch offset and row/column strides.
    // Per batch index, the offset of a mask's [b, 0, 0], and its row and column strides, the
    // mask broadcast to `[batch.., S, T]` (`batch`: the scores' batch dims, or a view of them
    // with the same product: the same batch index in row-major order); `None` when the mask
    // does not broadcast to that shape.
    let layout = |shape: &[usize], batch: &[usize]| -> Option<(Vec<isize>, isize, isize)> {
        let mut score_shape = batch.to_vec();
        score_shape.extend([s, t]);
        if shape.len() > score_shape.len()
            || broadcast_shapes(shape, &score_shape).ok().as_deref() != Some(&score_shape)
        {
            return None;
        }
        let st = broadcast_strides(shape, &score_shape);
        let mut offs = Vec::with_capacity(nb);
        let mut idx = vec![0usize; batch.len()];
        for _ in 0..nb {
            let o: isize = idx.iter().zip(&st).map(|(&i, &x)| i as isize * x).sum();
            offs.push(o);
            crate::util::next_index(&mut idx, batch);
        }
        Some((offs, st[batch.len()], st[batch.len() + 1]))
    };
    let mut mask_data = Vec::with_capacity(masks.len());
    for m in masks {
        let (Some(md), Some((offs, rs, cs))) = (m.as_f32(), layout(m.shape(), bq)) else {
            return Ok(None);
        };
        mask_data.push((md, offs, rs, cs));
    }
    let select_data = match select {
        Some(sel) => {
            let batch = match sel.view {
                None => bq.to_vec(),
                Some(view) => match resolve_view(view, nb) {
                    Some(b) => b,
                    None => return Ok(None),
                },
            };
            let (fusebox_core::runtime::StorageRef::Bool(cd), Some((offs, rs, cs))) =
                (sel.cond.storage(), layout(sel.cond.shape(), &batch))
            else {
                return Ok(None);
            };
            Some((cd, offs, rs, cs, sel.fill))
        }
        None => None,
    };
    let n_out = nb
        .checked_mul(s)
        .and_then(|x| x.checked_mul(dv))
        .ok_or("the output's size overflows")?;
    // The output's rows in its own order: the dims before S (outer), S, the dims after it
    // (inner). Rows `i0..i1` of one outer index, every inner index, are one run of the output;
    // `units[o * inner + j]` is the batch index of outer `o`, inner `j`.
    let mut logical = bq.to_vec();
    logical.extend([s, dv]);
    let at_s = po.iter().position(|&k| k == r - 2).unwrap_or(r - 2);
    let (outer_dims, inner_dims) = (&po[..at_s], &po[at_s + 1..r - 1]);
    let inner: usize = inner_dims.iter().map(|&k| logical[k]).product();
    let units = {
        let batch_strides = crate::util::strides(bq);
        let mut order = outer_dims.to_vec();
        order.extend_from_slice(inner_dims);
        let dims: Vec<usize> = order.iter().map(|&k| logical[k]).collect();
        let mut idx = vec![0usize; order.len()];
        let mut units: Vec<usize> = Vec::with_capacity(nb);
        for _ in 0..nb {
            units.push(
                order
                    .iter()
                    .zip(&idx)
                    .map(|(&k, &i)| i * batch_strides[k])
                    .sum(),
            );
            crate::util::next_index(&mut idx, &dims);
        }
        units
    };
    let threads = crate::par::threads_for(nb * s * t * (d + dv), 1 << 15);
    let mut out = crate::par::scratch_f32(n_out);
    let block_rows = rows_per_task(t);
    // Tasks: (batch index, first row, that block of rows of the output). Per outer index the
    // output is an `[S, inner · Dv]` matrix: cut into blocks of rows, each cut into the inner
    // indices' `Dv` columns (without a permutation, inner is 1: blocks of one head's rows).
    let mut tasks = Vec::new();
    if s * dv * inner > 0 {
        for (o, chunk) in out.chunks_mut(s * inner * dv).enumerate() {
            let mut rest = MatMut::from_row_major_slice_mut(chunk, s, inner * dv);
            let mut i0 = 0;
            while i0 < s {
                let n = block_rows.min(s - i0);
                let (mut band, below) = rest.split_at_row_mut(n);
                rest = below;
                for j in 0..inner {
                    let (unit, right) = band.split_at_col_mut(dv);
                    band = right;
                    let Some(unit) = unit.try_as_row_major_mut() else {
                        return Ok(None);
                    };
                    tasks.push((units[o * inner + j], i0, unit));
                }
                i0 += n;
            }
        }
    }
    let (q_st, k_st, v_st) = (
        (qst[r - 2], qst[r - 1]),
        (kst[r - 2], kst[r - 1]),
        (vst[r - 2], vst[r - 1]),
    );
    let res: Result<(), ()> = crate::par::run_tasks(tasks, threads, |(b, i0, unit)| {
        let mask_rows: Vec<Mask<'_>> = mask_data
            .iter()
            .map(|(md, offs, rs, cs)| (*md, offs[b], *rs, *cs))
            .collect();
        let select = select_data
            .as_ref()
            .map(|(cd, offs, rs, cs, fill)| (*cd, offs[b], *rs, *cs, *fill));
        crate::simd::dispatch(Block {
            q: Strided::at(qd, q_off[b], s, d, q_st.0, q_st.1).rows(i0, unit.nrows()),
            kt: Strided::at(kd, k_off[b], d, t, k_st.0, k_st.1),
            v: Strided::at(vd, v_off[b], t, dv, v_st.0, v_st.1),
            masks: &mask_rows,
            select,
            spec,
            i0,
            out: unit,
        });
        Ok(())
    });
    debug_assert!(res.is_ok());
    let shape: Vec<usize> = po.iter().map(|&k| logical[k]).collect();
    out.into_tensor(shape).map(Some)
}

/// `e^x` in `f32`, branch-free so loops over it vectorise: Cephes' `expf` (range reduction by
/// `ln 2` in two parts, a degree-6 polynomial, the exponent put in by its bits; about 1 ulp),
/// every multiply-add of it one fused `mul_add` (one rounding: the same bits whether the CPU
/// or libm does it, and on AVX2 a loop of it takes 0.66 of the time of separate multiplies
/// and adds, the dependent chain being half as long; bench/RESULTS.md, session bw).
/// `e^x` underflows to 0 below -87.3 (as `-inf` does), NaN stays NaN, and inputs above 88.3
/// are taken as 88.3 (the softmax only ever passes `x - max ≤ 0`).
#[inline(always)]
pub(crate) fn exp32(x: f32) -> f32 {
    let y = exp32_clamped(x);
    if x < -87.3 { 0.0 } else { y }
}

/// [`exp32`] without its underflow to 0: `e^x` of `x` clamped to `[-87.3, 88.3]` (below
/// -87.3 the smallest normal value it takes there, about `1.2e-38`, instead of 0). For a
/// caller that adds 1 to it (the sigmoid's `1 + e^-x`) the two give the same sums, and the
/// compare and select it saves are two of about twenty vector operations.
#[inline(always)]
pub(crate) fn exp32_clamped(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // Round to nearest by the 1.5 * 2^23 trick (no libm call): `t` is `MAGIC + n`.
    const MAGIC: f32 = 12_582_912.0;
    let xc = x.clamp(-87.3, 88.3);
    let t = xc.mul_add(LOG2E, MAGIC);
    let n = t - MAGIC;
    let r = (-n).mul_add(0.693_359_4, xc);
    let r = (-n).mul_add(-2.121_944_4e-4, r);
    let mut y = 1.987_569_1e-4_f32;
    y = y.mul_add(r, 1.398_2e-3);
    y = y.mul_add(r, 8.333_452e-3);
    y = y.mul_add(r, 4.166_579_6e-2);
    y = y.mul_add(r, 0.166_666_65);
    y = y.mul_add(r, 0.5);
    y = (y * r).mul_add(r, r) + 1.0;
    // 2^n from `t`'s bits: `n` is `t`'s low mantissa bits less MAGIC's (an integer in
    // -126..=127 after the clamp), so no float-to-int conversion (which does not vectorise
    // well) is needed; the same bits as `((n as i32 + 127) as u32) << 23`.
    let scale = f32::from_bits(t.to_bits().wrapping_sub(MAGIC.to_bits()).wrapping_add(127) << 23);
    y * scale
}

/// The largest element of `row` (NaN ignored, as `f32::max` does; `-inf` when empty), as
/// [`MAX_LANES`] interleaved running maxima, which vectorises. The maximum does not depend on
/// the grouping, so the lane count is free: 64 make four AVX-512 chains (eight of AVX2), so
/// the `max`'s latency (with its NaN select) is hidden instead of paid per vector.
#[inline(always)]
pub(crate) fn striped_max_f32(row: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; MAX_LANES];
    let mut chunks = row.chunks_exact(MAX_LANES);
    for c in &mut chunks {
        for (a, &x) in acc.iter_mut().zip(c) {
            *a = a.max(x);
        }
    }
    for (a, &x) in acc.iter_mut().zip(chunks.remainder()) {
        *a = a.max(x);
    }
    // Halves folded lane-wise (vector maxima down to one vector's lanes), then the lanes.
    let mut n = MAX_LANES;
    while n > 1 {
        n /= 2;
        let (lo, hi) = acc.split_at_mut(n);
        for (a, &b) in lo.iter_mut().zip(&hi[..n]) {
            *a = a.max(b);
        }
    }
    acc[0]
}

/// The running maxima of [`striped_max_f32`].
const MAX_LANES: usize = 64;

/// A mask's data, the offset of this batch index's `[0, 0]`, and its row and column strides.
type Mask<'a> = (&'a [f32], isize, isize, isize);

/// A select mask's condition as [`Mask`] holds an additive one, and its fill.
type Select<'a> = (&'a [bool], isize, isize, isize, f32);

/// [`block`]'s buffers, kept per thread between its tasks (taken out for a task, put back
/// after it): the block's scores, and the scaled or gathered query rows, key and value blocks.
/// A fresh score block per task cost ViT-base's attention 7% in zeroing alone.
#[derive(Default)]
struct Bufs {
    sc: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
}

thread_local! {
    static BUFS: std::cell::RefCell<Bufs> = std::cell::RefCell::new(Bufs::default());
}

/// The most floats [`Bufs`] keeps on a thread between tasks (16 MiB; a 256-row task of
/// 1024-key blocks and 128-wide heads needs 1.5 MiB).
const KEEP_FLOATS: usize = 1 << 22;

/// One block of query rows `i0..i0+rows` of one batch index, over all keys in blocks of `BK`,
/// compiled for the widest instruction set of this CPU ([`crate::simd::dispatch`]; the
/// result does not depend on it), into `out` (`rows × Dv`, its rows contiguous).
struct Block<'a> {
    q: Strided<'a>,
    kt: Strided<'a>,
    v: Strided<'a>,
    masks: &'a [Mask<'a>],
    select: Option<Select<'a>>,
    spec: &'a AttnSpec,
    i0: usize,
    out: RowsMut<'a>,
}

/// A block of output rows, each row contiguous.
type RowsMut<'a> = MatMut<'a, f32, usize, usize, isize, faer::ContiguousFwd>;

impl pulp::WithSimd for Block<'_> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) {
        block(self);
    }
}

#[inline(always)]
fn block(
    Block {
        q,
        kt,
        v,
        masks,
        select,
        spec,
        i0,
        mut out,
    }: Block<'_>,
) {
    let (rows, t, dv) = (q.rows, kt.cols, v.cols);
    if rows == 0 || dv == 0 {
        return;
    }
    let mut bufs = BUFS.with(|b| std::mem::take(&mut *b.borrow_mut()));
    let Bufs {
        sc,
        q: qbuf,
        k: kbuf,
        v: vbuf,
    } = &mut bufs;
    // Scaled query rows (a view of the rows themselves without a scale).
    let qm = q.view_or_copy(spec.q_scale, qbuf);
    let mut m = vec![f32::NEG_INFINITY; rows];
    let mut l = vec![0.0f32; rows];
    out.fill(0.0);
    let bk = if t <= BK_MAX { t.max(1) } else { BK };
    // Each block's scores are written whole by the first GEMM: grown, never cleared.
    if sc.len() < rows * bk {
        sc.resize(rows * bk, 0.0);
    }
    let mut j0 = 0;
    while j0 < t {
        let w = bk.min(t - j0);
        // The key block, [d, w]: scaled (or gathered) into `kbuf`, or a view of `kt`.
        let kb = kt.cols(j0, w).view_or_copy(spec.k_scale, kbuf);
        // Scores of the block, [rows, w]: one sequential faer GEMM.
        let sc = &mut sc[..rows * w];
        faer::linalg::matmul::matmul(
            MatMut::from_row_major_slice_mut(sc, rows, w),
            Accum::Replace,
            qm,
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
            if let Some((cd, off, rs, cs, fill)) = select {
                let base = off + i as isize * rs + j0 as isize * cs;
                for (jj, x) in sc.iter_mut().enumerate() {
                    if cd[(base + jj as isize * cs) as usize] {
                        *x = fill;
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
                out.rb_mut()
                    .row_mut(r)
                    .as_slice_mut()
                    .iter_mut()
                    .for_each(|x| *x *= corr);
            }
            sc.iter_mut().for_each(|x| *x = exp32(*x - m_new));
            l[r] += crate::simd::striped_sum(sc, |x| x);
            m[r] = m_new;
        }
        // out[rows, dv] += p[rows, w] @ v[j0..j0 + w, dv].
        let vb = v.rows(j0, w).view_or_copy(Scale::None, vbuf);
        faer::linalg::matmul::matmul(
            out.rb_mut(),
            Accum::Add,
            MatRef::from_row_major_slice(sc, rows, w),
            vb,
            1.0f32,
            Par::Seq,
        );
        j0 += w;
    }
    let mut poisoned: Option<Vec<bool>> = None;
    for r in 0..rows {
        let orow = out.rb_mut().row_mut(r).as_slice_mut();
        let inv = 1.0 / l[r];
        let bad = !l[r].is_finite() || l[r] == 0.0 || m[r] == f32::NEG_INFINITY;
        if bad && spec.nan_guard {
            // The guard zeroes the row's probabilities, and the graph still multiplies those
            // zeros by every value row: `0 * NaN` and `0 * inf` keep a column NaN. Which
            // columns hold one is found once per block, at its first such row.
            let poisoned = poisoned.get_or_insert_with(|| {
                (0..dv)
                    .map(|e| (0..t).any(|j| !v.data[j * v.rs + e * v.cs].is_finite()))
                    .collect::<Vec<bool>>()
            });
            for (x, &p) in orow.iter_mut().zip(poisoned.iter()) {
                *x = if p { f32::NAN } else { 0.0 };
            }
        } else if bad {
            orow.iter_mut().for_each(|x| *x = f32::NAN);
        } else {
            orow.iter_mut().for_each(|x| *x *= inv);
        }
    }
    // Kept for the next task unless an unusual shape made them large.
    let kept = [&bufs.sc, &bufs.q, &bufs.k, &bufs.v].map(Vec::capacity);
    if kept.iter().sum::<usize>() <= KEEP_FLOATS {
        BUFS.with(|b| *b.borrow_mut() = bufs);
    }
}
