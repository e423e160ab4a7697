//! Data-movement kernels: `reshape`, `permute_dims`, `layout_transform`, `concat`, `split`, `flatten`, `squeeze`,
//! `expand_dims`, `strided_slice`, `take` and `broadcast_to`. They work on every dtype and
//! copy elements bit for bit.
//!
//! `strided_slice` clamps like numpy; `take` in `fast` mode counts negative indices from the
//! end (as ONNX Gather) and rejects out-of-range ones (there is no undefined behaviour to
//! mimic), `clip` clamps them and `wrap` wraps them.
//!
//! ```text
//! r: R.Tensor((2, 6), dtype="float32") = R.reshape(x, R.shape([2, -1]))   # x: (3, 4)
//! s: R.Tuple(R.Tensor((3, 2)), R.Tensor((3, 2))) = R.split(x, indices_or_sections=2, axis=1)
//! ```

use crate::util::{
    KResult, broadcast_strides, gather_tensor, map_same, norm_axes, norm_axis, numel, permute,
    strides, tensor,
};
use fusebox_core::op::{IndexMap, Layout, SplitSpec, StridedSliceAttrs, TakeMode};
use fusebox_core::runtime::{Storage, StorageRef, Tensor};

/// `reshape` to `shape` (at most one `-1`, inferred).
pub(crate) fn reshape(x: &Tensor, shape: &[i64]) -> KResult<Tensor> {
    let mut holes = 0;
    let mut known = 1usize;
    for &d in shape {
        match d {
            -1 => holes += 1,
            d if d < 0 => return Err(format!("invalid dim {d} in the new shape {shape:?}")),
            d => {
                known = known
                    .checked_mul(d as usize)
                    .ok_or_else(|| format!("the new shape {shape:?} overflows"))?;
            }
        }
    }
    if holes > 1 {
        return Err(format!("at most one -1 is allowed in {shape:?}"));
    }
    let n = x.numel();
    let out: Vec<usize> = if holes == 1 {
        if known == 0 || !n.is_multiple_of(known) {
            return Err(format!(
                "cannot reshape {:?} to {shape:?}: {n} elements are not a multiple of {known}",
                x.shape()
            ));
        }
        shape
            .iter()
            .map(|&d| if d == -1 { n / known } else { d as usize })
            .collect()
    } else {
        shape.iter().map(|&d| d as usize).collect()
    };
    x.reshaped(out).map_err(|e| e.to_string())
}

/// `permute_dims` (`None`: reverse the axes).
pub(crate) fn permute_dims(x: &Tensor, axes: Option<&[i64]>) -> KResult<Tensor> {
    let r = x.rank();
    let perm = match axes {
        Some(a) => {
            if a.len() != r {
                return Err(format!("expected {r} axes, found {a:?}"));
            }
            norm_axes(a, r)?
        }
        None => (0..r).rev().collect(),
    };
    Ok(permute(x, &perm))
}

/// `layout_transform` by `map`: the input reshaped into the map's parts (each split axis as
/// `(d / k, k)`), those permuted into the output's order, and the result reshaped.
pub(crate) fn layout_transform(x: &Tensor, map: &IndexMap) -> KResult<Tensor> {
    let fusebox_core::op::Permute { split, perm, out } = map.as_permute(x.shape())?;
    if let (Some(data), Some((outer, rows, cols))) = (x.as_f32(), batched_transpose(&split, &perm))
    {
        // NCHW ↔ NCHW16c: per image, a (C/16 · 16) × HW ↔ HW × 16 block transpose.
        // A recycled buffer: a fresh one's first touch of each page cost as much as the copy.
        let mut y = crate::par::scratch_f32(data.len());
        transpose_f32(data, &mut y, outer, rows, cols);
        return y.into_tensor(out);
    }
    let parts = x.reshaped(split).map_err(|e| e.to_string())?;
    permute(&parts, &perm)
        .reshaped(out)
        .map_err(|e| e.to_string())
}

/// `perm` of a tensor of shape `split` as `outer` transposes of `rows × cols` matrices
/// (`[outer][rows][cols]` to `[outer][cols][rows]`): one axis moved to the end (NCHW to
/// NCHW16c), or the last axis moved inward (back); `None` for any other permutation.
fn batched_transpose(split: &[usize], perm: &[usize]) -> Option<(usize, usize, usize)> {
    let r = perm.len();
    let a = perm
        .iter()
        .enumerate()
        .take_while(|&(i, &p)| i == p)
        .count();
    let rest = perm.get(a..)?;
    let prod = |s: &[usize]| s.iter().product::<usize>();
    if r < 2 || a + 1 >= r {
        return None;
    }
    let moved_out = rest.last() == Some(&a)
        && rest[..rest.len() - 1]
            .iter()
            .enumerate()
            .all(|(i, &p)| p == a + 1 + i);
    if moved_out {
        return Some((prod(&split[..a]), split[a], prod(&split[a + 1..])));
    }
    let moved_in =
        rest.first() == Some(&(r - 1)) && rest[1..].iter().enumerate().all(|(i, &p)| p == a + i);
    moved_in.then(|| (prod(&split[..a]), prod(&split[a..r - 1]), split[r - 1]))
}

/// `y[o][c][r] = x[o][r][c]` for `outer` matrices of `rows × cols`, the matrices spread over
/// the threads. Whole 16 × 16 tiles are transposed in registers on AVX-512 ([`tile_v4`]: 16
/// row loads, four rounds of 16 two-source lane permutes, 16 column stores), else copied into
/// a local tile by rows and written out by columns; the edges one element at a time.
/// (ResNet-50's two transforms: 0.18–0.19 ms on two threads with the local tiles, session aw;
/// the first alone took 0.40 ms with bounds-dependent 16 × 16 loops on one thread, session av,
/// another host. MobileNetV2's 144 × 28 × 28 into `NCHW16c`, two threads allowed: 0.037–0.045
/// ms a call with the local tiles on one thread (a work grain of 2^16 elements), 0.021–0.025
/// in registers on two (2^15), session be.)
fn transpose_f32(x: &[f32], y: &mut [f32], outer: usize, rows: usize, cols: usize) {
    let m = rows * cols;
    if m == 0 {
        return;
    }
    let t = crate::par::threads_for(outer * m, 1 << 15);
    crate::par::for_each_chunk_mut(&mut y[..outer * m], m, t, |off, yo| {
        crate::simd::dispatch(Transpose {
            x: &x[off..off + m],
            y: yo,
            rows,
            cols,
        });
    });
}

/// One matrix of [`transpose_f32`], compiled for the CPU's widest instruction set.
struct Transpose<'a> {
    x: &'a [f32],
    y: &'a mut [f32],
    rows: usize,
    cols: usize,
}

impl pulp::WithSimd for Transpose<'_> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) {
        transpose_one(self.x, self.y, self.rows, self.cols);
    }
}

/// Lanes of an AVX-512 `f32` vector, the side of [`transpose_one`]'s tiles where AVX-512
/// runs and both sides of the matrix reach it.
const T: usize = 16;

/// Lanes of an AVX2 `f32` vector, the side of [`transpose_one`]'s tiles otherwise: an
/// `NCHW8c` block's 8 channels, and AVX2's in-register transpose ([`tile_v3`]).
const T8: usize = 8;

/// One matrix of [`transpose_f32`]: whole tiles of 16 × 16 where AVX-512 runs and both sides
/// reach 16 ([`tile_v4`]), else of 8 × 8 ([`tile_v3`] on AVX2: `NCHW8c`'s 8-channel side
/// went element by element before, and an 8 × 8 boundary of MobileNetV2's took 0.09 ms),
/// copied through a local tile without either; the edges one element at a time.
#[inline(always)]
fn transpose_one(x: &[f32], y: &mut [f32], rows: usize, cols: usize) {
    #[cfg(target_arch = "x86_64")]
    let (v4, v3) = (pulp::x86::V4::try_new(), pulp::x86::V3::try_new());
    #[cfg(target_arch = "x86_64")]
    let wide = v4.is_some() && rows >= T && cols >= T;
    #[cfg(not(target_arch = "x86_64"))]
    let wide = rows >= T && cols >= T;
    let side = if wide { T } else { T8 };
    let (fr, fc) = (rows / side * side, cols / side * side);
    let mut m = Mat { x, y, rows, cols };
    for r0 in (0..fr).step_by(side) {
        for c0 in (0..fc).step_by(side) {
            #[cfg(target_arch = "x86_64")]
            match (wide, v4, v3) {
                (true, Some(v4), _) => {
                    tile_v4(v4, &mut m, r0, c0);
                    continue;
                }
                (false, _, Some(v3)) => {
                    tile_v3(v3, &mut m, r0, c0);
                    continue;
                }
                _ => {}
            }
            if wide {
                tile_local::<T>(&mut m, r0, c0);
            } else {
                tile_local::<T8>(&mut m, r0, c0);
            }
        }
    }
    // The edges: the columns past the last whole tile in the tiled rows, then the rows past
    // them, each row read in order.
    let Mat { x, y, .. } = m;
    for r in 0..fr {
        for c in fc..cols {
            y[c * rows + r] = x[r * cols + c];
        }
    }
    for r in fr..rows {
        for (c, &v) in x[r * cols..(r + 1) * cols].iter().enumerate() {
            y[c * rows + r] = v;
        }
    }
}

/// One matrix of [`transpose_f32`]: `x` (`rows × cols`) and its transpose `y`.
struct Mat<'a> {
    x: &'a [f32],
    y: &'a mut [f32],
    rows: usize,
    cols: usize,
}

/// The `S × S` tile of `m.x` at row `r0`, column `c0` into `m.y`, copied into a local tile by
/// rows and written out by columns.
#[inline(always)]
fn tile_local<const S: usize>(m: &mut Mat<'_>, r0: usize, c0: usize) {
    let (x, rows, cols) = (m.x, m.rows, m.cols);
    let y = &mut *m.y;
    let mut tile = [[0.0f32; S]; S];
    for (i, t) in tile.iter_mut().enumerate() {
        t.copy_from_slice(&x[(r0 + i) * cols + c0..][..S]);
    }
    for j in 0..S {
        let dst = &mut y[(c0 + j) * rows + r0..][..S];
        for (d, t) in dst.iter_mut().zip(&tile) {
            *d = t[j];
        }
    }
}

/// The 8 × 8 tile of `m.x` at row `r0`, column `c0`, transposed into `m.y` at row `c0`,
/// column `r0`, in AVX2 registers: rows interleaved in pairs (`unpacklo`/`unpackhi`),
/// then in fours (`shuffle`), then the 128-bit halves exchanged (`permute2f128`), so that
/// output `j` is column `j`. Each element is moved, never computed: bit for bit.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn tile_v3(v3: pulp::x86::V3, m: &mut Mat<'_>, r0: usize, c0: usize) {
    use std::arch::x86_64::__m256;
    let (x, rows, cols) = (m.x, m.rows, m.cols);
    let y = &mut *m.y;
    let a = v3.avx;
    let mut r: [__m256; T8] = [pulp::cast([0.0f32; T8]); T8];
    for (i, ri) in r.iter_mut().enumerate() {
        *ri = pulp::cast(bytemuck::pod_read_unaligned::<[f32; T8]>(
            bytemuck::cast_slice(&x[(r0 + i) * cols + c0..][..T8]),
        ));
    }
    // Plain loops, not `array::from_fn` (see [`tile_v4`]). `t[2k]` and `t[2k + 1]`: rows 2k
    // and 2k + 1 interleaved (columns 0, 1, 4, 5 and 2, 3, 6, 7 of the pair).
    let mut t = r;
    for k in 0..T8 / 2 {
        t[2 * k] = a._mm256_unpacklo_ps(r[2 * k], r[2 * k + 1]);
        t[2 * k + 1] = a._mm256_unpackhi_ps(r[2 * k], r[2 * k + 1]);
    }
    // `s[4h + m]`: columns `m` and `m + 4` of rows `4h..4h + 4`, one per 128-bit half.
    let mut s = t;
    for h in 0..2 {
        let (lo, hi) = ((t[4 * h], t[4 * h + 2]), (t[4 * h + 1], t[4 * h + 3]));
        s[4 * h] = a._mm256_shuffle_ps::<0x44>(lo.0, lo.1);
        s[4 * h + 1] = a._mm256_shuffle_ps::<0xEE>(lo.0, lo.1);
        s[4 * h + 2] = a._mm256_shuffle_ps::<0x44>(hi.0, hi.1);
        s[4 * h + 3] = a._mm256_shuffle_ps::<0xEE>(hi.0, hi.1);
    }
    // Column `m` from the low halves of `s[m]` and `s[m + 4]`, column `m + 4` from the high.
    let mut out = s;
    for m in 0..T8 / 2 {
        out[m] = a._mm256_permute2f128_ps::<0x20>(s[m], s[m + 4]);
        out[m + 4] = a._mm256_permute2f128_ps::<0x31>(s[m], s[m + 4]);
    }
    for (j, col) in out.iter().enumerate() {
        let v: [f32; T8] = pulp::cast(*col);
        y[(c0 + j) * rows + r0..][..T8].copy_from_slice(&v);
    }
}

/// The 16 × 16 tile of `m.x` (`rows × cols`) at row `r0`, column `c0`, transposed into `m.y`
/// (`cols × rows`) at row `c0`, column `r0`, in registers: round `b` (8, 4, 2, 1) takes each
/// pair of vectors `b` apart and swaps the `b`-lane blocks that sit off the diagonal (`v[i]`
/// keeps its blocks of lanes `j` with `j & b = 0` and takes `v[i + b]`'s others moved down;
/// `v[i + b]` the reverse), so after the four rounds `v[j]` is column `j`. Each element is
/// moved, never computed: bit for bit.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn tile_v4(v4: pulp::x86::V4, m: &mut Mat<'_>, r0: usize, c0: usize) {
    use std::arch::x86_64::__m512;
    let (x, rows, cols) = (m.x, m.rows, m.cols);
    let y = &mut *m.y;
    // Plain loops, not `array::from_fn` (a call the compiler kept out of line, compiled
    // without AVX-512).
    let mut v: [__m512; T] = [pulp::cast([0.0f32; T]); T];
    for (i, vi) in v.iter_mut().enumerate() {
        *vi = pulp::cast(bytemuck::pod_read_unaligned::<[f32; T]>(
            bytemuck::cast_slice(&x[(r0 + i) * cols + c0..][..T]),
        ));
    }
    swap_blocks::<8>(v4, &mut v);
    swap_blocks::<4>(v4, &mut v);
    swap_blocks::<2>(v4, &mut v);
    swap_blocks::<1>(v4, &mut v);
    for (j, col) in v.iter().enumerate() {
        let out: [f32; T] = pulp::cast(*col);
        y[(c0 + j) * rows + r0..][..T].copy_from_slice(&out);
    }
}

/// Round `B` of [`tile_v4`] (its own function so that `B` is a constant and the eight pairs
/// unroll, every vector in a register).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn swap_blocks<const B: usize>(v4: pulp::x86::V4, v: &mut [std::arch::x86_64::__m512; T]) {
    let f = v4.avx512f;
    // Lane `j` of the new `v[i]` and `v[i + B]`, as `permutex2var` indexes `v[i] ++ v[i + B]`.
    let (mut keep, mut take) = ([0u32; T], [0u32; T]);
    for j in 0..T {
        let (k, t) = if j & B == 0 {
            (j, j + B)
        } else {
            (T + j - B, T + j)
        };
        keep[j] = k as u32;
        take[j] = t as u32;
    }
    let (keep, take): (std::arch::x86_64::__m512i, std::arch::x86_64::__m512i) =
        (pulp::cast(keep), pulp::cast(take));
    for k in 0..T / 2 {
        let i = k / B * 2 * B + k % B;
        let (lo, hi) = (v[i], v[i + B]);
        v[i] = f._mm512_permutex2var_ps(lo, keep, hi);
        v[i + B] = f._mm512_permutex2var_ps(lo, take, hi);
    }
}

/// `f` (a kernel of `NCHW` data) on `x` held in the split layout `layout` (`NCHW16c`), its
/// result laid out in `out_layout`: `None` when neither layout splits an axis (the kernels
/// take permutations of `NCHW` themselves).
pub(crate) fn through_nchw(
    x: &Tensor,
    layout: &str,
    out_layout: &str,
    f: impl FnOnce(&Tensor) -> KResult<Tensor>,
) -> Option<KResult<Tensor>> {
    let (Some(from), Some(to), Some(nchw)) = (
        Layout::parse(layout, "NCHW"),
        Layout::parse(out_layout, "NCHW"),
        Layout::parse("NCHW", "NCHW"),
    ) else {
        return Some(Err(format!(
            "invalid layout \"{layout}\" or \"{out_layout}\""
        )));
    };
    if from.is_plain() && to.is_plain() {
        return None;
    }
    let run = || -> KResult<Tensor> {
        let xc = layout_transform(x, &IndexMap::between(&from, &nchw)?)?;
        layout_transform(&f(&xc)?, &IndexMap::between(&nchw, &to)?)
    };
    Some(run())
}

/// `concat` along `axis` (`None`: flatten every input first).
pub(crate) fn concat(xs: &[&Tensor], axis: Option<i64>) -> KResult<Tensor> {
    let first = xs.first().ok_or("expected a non-empty tuple of tensors")?;
    let dtype = first.dtype();
    if let Some(t) = xs.iter().find(|t| t.dtype() != dtype) {
        return Err(format!(
            "expected every tensor to have dtype {dtype}, found {}",
            t.dtype()
        ));
    }
    let flat: Vec<Tensor>;
    let (xs, axis): (Vec<&Tensor>, usize) = match axis {
        None => {
            flat = xs
                .iter()
                .map(|t| t.reshaped(vec![t.numel()]))
                .collect::<Result<_, _>>()
                .map_err(|e| e.to_string())?;
            (flat.iter().collect(), 0)
        }
        Some(a) => (xs.to_vec(), norm_axis(a, first.rank())?),
    };
    let base = xs[0].shape();
    let mut out_shape = base.to_vec();
    out_shape[axis] = 0;
    for t in &xs {
        let s = t.shape();
        if s.len() != base.len()
            || s.iter()
                .zip(base)
                .enumerate()
                .any(|(i, (a, b))| i != axis && a != b)
        {
            return Err(format!(
                "expected every tensor to match {base:?} on the axes other than {axis}, found {s:?}"
            ));
        }
        out_shape[axis] += s[axis];
    }
    let outer: usize = base[..axis].iter().product();
    let inner: usize = base[axis + 1..].iter().product();
    let total = numel(&out_shape)?;
    macro_rules! cat {
        ($var:ident) => {{
            let parts: Vec<&[_]> = xs
                .iter()
                .map(|t| match t.storage() {
                    StorageRef::$var(v) => v,
                    _ => &[],
                })
                .collect();
            let mut out = Vec::with_capacity(total);
            for o in 0..outer {
                for (p, t) in parts.iter().zip(&xs) {
                    let chunk = t.shape()[axis] * inner;
                    out.extend_from_slice(&p[o * chunk..(o + 1) * chunk]);
                }
            }
            Storage::$var(out)
        }};
    }
    let data = match first.storage() {
        StorageRef::F16(_) => cat!(F16),
        StorageRef::BF16(_) => cat!(BF16),
        StorageRef::F32(_) => cat!(F32),
        StorageRef::F64(_) => cat!(F64),
        StorageRef::I8(_) => cat!(I8),
        StorageRef::U8(_) => cat!(U8),
        StorageRef::I32(_) => cat!(I32),
        StorageRef::I64(_) => cat!(I64),
        StorageRef::Bool(_) => cat!(Bool),
    };
    tensor(out_shape, data)
}

/// The `[start, end)` ranges of a split of an extent `len` (as TVM: sections of
/// `ceil(len / n)`, the last ones smaller or empty; indices clamped into `[0, len]`).
pub(crate) fn split_ranges(len: usize, spec: &SplitSpec) -> KResult<Vec<(usize, usize)>> {
    match spec {
        SplitSpec::Sections(n) => {
            let n = usize::try_from(*n)
                .ok()
                .filter(|&n| n >= 1)
                .ok_or_else(|| format!("expected at least 1 section, found {n}"))?;
            let part = len.div_ceil(n);
            Ok((0..n)
                .map(|i| {
                    let s = (part * i).min(len);
                    (s, (s + part).min(len))
                })
                .collect())
        }
        SplitSpec::Indices(idx) => {
            let mut out = Vec::with_capacity(idx.len() + 1);
            let mut prev = 0usize;
            for &i in idx {
                let cur = i.clamp(0, len as i64) as usize;
                out.push((prev, cur.max(prev)));
                prev = prev.max(cur);
            }
            out.push((prev, len));
            Ok(out)
        }
    }
}

/// Copies `[start, end)` of `axis`.
fn slice_axis(x: &Tensor, axis: usize, start: usize, end: usize) -> KResult<Tensor> {
    let mut shape = x.shape().to_vec();
    shape[axis] = end - start;
    let st: Vec<isize> = strides(x.shape()).iter().map(|&s| s as isize).collect();
    let off = start as isize * st[axis];
    gather_tensor(x.storage(), off, &st, shape)
}

/// `split` into a tuple of tensors.
pub(crate) fn split(x: &Tensor, spec: &SplitSpec, axis: i64) -> KResult<Vec<Tensor>> {
    let axis = norm_axis(axis, x.rank())?;
    split_ranges(x.shape()[axis], spec)?
        .into_iter()
        .map(|(s, e)| slice_axis(x, axis, s, e))
        .collect()
}

/// `flatten` to 1-D (a scalar becomes `(1,)`).
pub(crate) fn flatten(x: &Tensor) -> KResult<Tensor> {
    x.reshaped(vec![x.numel()]).map_err(|e| e.to_string())
}

/// `squeeze` the given extent-1 axes (`None`: all of them).
pub(crate) fn squeeze(x: &Tensor, axis: Option<&[i64]>) -> KResult<Tensor> {
    let s = x.shape();
    let out: Vec<usize> = match axis {
        None => s.iter().copied().filter(|&d| d != 1).collect(),
        Some(a) => {
            let axes = norm_axes(a, s.len())?;
            if let Some(&bad) = axes.iter().find(|&&i| s[i] != 1) {
                return Err(format!(
                    "cannot squeeze axis {bad} of extent {} (shape {s:?})",
                    s[bad]
                ));
            }
            (0..s.len())
                .filter(|i| !axes.contains(i))
                .map(|i| s[i])
                .collect()
        }
    };
    x.reshaped(out).map_err(|e| e.to_string())
}

/// `expand_dims`: extent-1 axes at `axis` (output numbering).
pub(crate) fn expand_dims(x: &Tensor, axis: &[i64]) -> KResult<Tensor> {
    let nr = x.rank() + axis.len();
    let axes = norm_axes(axis, nr)?;
    let mut rest = x.shape().iter();
    let out: Vec<usize> = (0..nr)
        .map(|i| {
            if axes.contains(&i) {
                1
            } else {
                rest.next().copied().unwrap_or(1)
            }
        })
        .collect();
    x.reshaped(out).map_err(|e| e.to_string())
}

/// `strided_slice` with numpy clamping.
pub(crate) fn strided_slice(x: &Tensor, a: &StridedSliceAttrs) -> KResult<Tensor> {
    let axes = norm_axes(&a.axes, x.rank())?;
    if a.begin.len() != axes.len() || a.end.len() != axes.len() {
        return Err("expected begin and end to have one value per axis".to_string());
    }
    let steps: Vec<i64> = match &a.strides {
        Some(s) if s.len() == axes.len() => s.clone(),
        Some(_) => return Err("expected strides to have one value per axis".to_string()),
        None => vec![1; axes.len()],
    };
    let mut shape = x.shape().to_vec();
    let mut st: Vec<isize> = strides(x.shape()).iter().map(|&s| s as isize).collect();
    let mut off = 0isize;
    for (i, &ax) in axes.iter().enumerate() {
        let n = x.shape()[ax] as i64;
        let (b, e, s) = (a.begin[i], a.end[i], steps[i]);
        if s == 0 {
            return Err("a stride of 0 is not allowed".to_string());
        }
        let norm = |v: i64, lo: i64, hi: i64| {
            let v = if v < 0 { v.saturating_add(n) } else { v };
            v.clamp(lo, hi)
        };
        let (start, len) = if s > 0 {
            let (b, e) = (norm(b, 0, n), norm(e, 0, n));
            (b, if e > b { (e - b + s - 1) / s } else { 0 })
        } else {
            let (b, e) = (norm(b, -1, n - 1), norm(e, -1, n - 1));
            (b, if b > e { (b - e - s - 1) / -s } else { 0 })
        };
        shape[ax] = len as usize;
        if len > 0 {
            off += start as isize * st[ax];
        }
        st[ax] *= s as isize;
    }
    gather_tensor(x.storage(), off, &st, shape)
}

/// `take` along `axis` (`None`: of the flattened tensor).
pub(crate) fn take(
    x: &Tensor,
    indices: &Tensor,
    axis: Option<i64>,
    mode: TakeMode,
) -> KResult<Tensor> {
    if !indices.dtype().is_int() {
        return Err(format!(
            "expected indices to have an integer dtype, found {}",
            indices.dtype()
        ));
    }
    let flat;
    let (x, axis) = match axis {
        None => {
            flat = flatten(x)?;
            (&flat, 0)
        }
        Some(a) => (x, norm_axis(a, x.rank())?),
    };
    let n = x.shape()[axis];
    let idx: Vec<usize> = indices
        .to_i64_vec()
        .into_iter()
        .map(|i| {
            let ni = n as i64;
            match mode {
                // Negative indices count from the end (ONNX Gather, and the CUDA lowering).
                TakeMode::Fast => usize::try_from(if i < 0 { i.saturating_add(ni) } else { i })
                    .ok()
                    .filter(|&u| u < n)
                    .ok_or_else(|| {
                        format!(
                            "index {i} is out of range for extent {n} (expected {} to {})",
                            -ni,
                            ni - 1
                        )
                    }),
                TakeMode::Clip => Ok(i.clamp(0, (ni - 1).max(0)) as usize),
                TakeMode::Wrap => {
                    if n == 0 {
                        Err(format!("cannot wrap index {i} into an empty axis"))
                    } else {
                        Ok(i.rem_euclid(ni) as usize)
                    }
                }
            }
        })
        .collect::<KResult<_>>()?;
    if n == 0 && !idx.is_empty() {
        return Err("cannot take from an empty axis".to_string());
    }
    let outer: usize = x.shape()[..axis].iter().product();
    let inner: usize = x.shape()[axis + 1..].iter().product();
    let mut shape: Vec<usize> = x.shape()[..axis].to_vec();
    shape.extend_from_slice(indices.shape());
    shape.extend_from_slice(&x.shape()[axis + 1..]);
    // Runs of consecutive indices (XLNet's relative shift takes `0..s`: one run) are copied
    // as one block of `len * inner` elements each.
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for &i in &idx {
        match runs.last_mut() {
            Some((start, len)) if *start + *len == i => *len += 1,
            _ => runs.push((i, 1)),
        }
    }
    let scattered = inner == 1 && runs.len() * 4 > idx.len();
    let fill = Take {
        outer,
        n,
        inner,
        idx: &idx,
        runs: &runs,
        scattered,
    };
    let total = outer * idx.len() * inner;
    if let Some(v) = x.as_f32() {
        // A recycled buffer, as the other kernels' outputs: a fresh one's first touch of each
        // page cost GPT-2's two embedding lookups (128 × 768 each) 1.1–1.2 ms a run, against
        // 20 µs for the copy (bench/RESULTS.md, session by).
        let mut out = crate::par::scratch_f32(total);
        fill.copy_into(v, &mut out);
        return out.into_tensor(shape);
    }
    let data = map_same!(x.storage(), v => {
        let mut out = vec![Default::default(); total];
        fill.copy_into(v, &mut out);
        out
    });
    tensor(shape, data)
}

/// [`take`]'s copy: `outer` blocks of `n × inner` source elements, from each the rows `idx`
/// (`runs`: the same as runs of consecutive rows, each copied as one block; `scattered`: an
/// `inner` of 1 with short runs, gathered element by element).
struct Take<'a> {
    outer: usize,
    n: usize,
    inner: usize,
    idx: &'a [usize],
    runs: &'a [(usize, usize)],
    scattered: bool,
}

impl Take<'_> {
    /// Fills `out` (`outer · idx.len() · inner` elements) from `v`.
    fn copy_into<T: Copy>(&self, v: &[T], out: &mut [T]) {
        let (n, inner) = (self.n, self.inner);
        let mut at = 0;
        for o in 0..self.outer {
            if self.scattered {
                // Single elements: one gather loop rather than a copy call each.
                let row = &v[o * n..(o + 1) * n];
                for (d, &i) in out[at..at + self.idx.len()].iter_mut().zip(self.idx) {
                    *d = row[i];
                }
                at += self.idx.len();
                continue;
            }
            for &(i, len) in self.runs {
                let b = (o * n + i) * inner;
                out[at..at + len * inner].copy_from_slice(&v[b..b + len * inner]);
                at += len * inner;
            }
        }
    }
}

/// `broadcast_to` a shape (numpy rules).
pub(crate) fn broadcast_to(x: &Tensor, shape: &[i64]) -> KResult<Tensor> {
    let target: Vec<usize> = shape
        .iter()
        .map(|&d| usize::try_from(d).map_err(|_| format!("invalid dim {d} in {shape:?}")))
        .collect::<KResult<_>>()?;
    let s = x.shape();
    if s.len() > target.len() {
        return Err(format!("cannot broadcast {s:?} to {target:?}"));
    }
    let off = target.len() - s.len();
    for (i, &d) in s.iter().enumerate() {
        if d != 1 && d != target[off + i] {
            return Err(format!("cannot broadcast {s:?} to {target:?}"));
        }
    }
    let st = broadcast_strides(s, &target);
    gather_tensor(x.storage(), 0, &st, target)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::panic, reason = "test code: a failure is a panic")]

    use super::*;

    /// The batched transpose against its definition, `y[o][c][r] = x[o][r][c]`, for shapes
    /// with and without whole 16 × 16 and 8 × 8 tiles and edges on either side (`NCHW8c`'s
    /// 8-channel blocks both ways), at one and two threads.
    #[test]
    fn batched_transpose_follows_its_definition() {
        for (outer, rows, cols) in [
            (1usize, 16usize, 3136usize),
            (3, 16, 49),
            (2, 49, 16),
            (2, 33, 17),
            (1, 48, 64),
            (1, 15, 15),
            (4, 1, 16),
            (2, 64, 0),
            (3, 8, 784),
            (2, 784, 8),
            (1, 8, 8),
            (2, 24, 17),
            (1, 9, 40),
        ] {
            let x: Vec<f32> = (0..outer * rows * cols).map(|i| i as f32).collect();
            let mut want = vec![0.0f32; x.len()];
            for o in 0..outer {
                for r in 0..rows {
                    for c in 0..cols {
                        want[(o * cols + c) * rows + r] = x[(o * rows + r) * cols + c];
                    }
                }
            }
            for threads in [1, 2] {
                let mut y = vec![-1.0f32; x.len()];
                crate::par::with_threads(threads, || transpose_f32(&x, &mut y, outer, rows, cols));
                assert!(y == want, "{outer} × {rows} × {cols}, {threads} threads");
            }
        }
    }

    /// `take` against its definition, `y[o][k][i] = x[o][idx[k]][i]`, for index lists made of
    /// runs, single scattered indices, repeats and a reversed run, with and without an inner
    /// extent, negative indices counted from the end; in `f32` and in `i64`.
    #[test]
    fn take_follows_its_definition_for_runs_and_scattered_indices() {
        let lists: [&[i64]; 6] = [
            &[0, 1, 2, 3, 4, 5, 6],
            &[2, 3, 4, 0, 1, 5],
            &[6, 0, 3, 3, 1],
            &[5, 4, 3, 2, 1],
            &[-1, -7, 2],
            &[],
        ];
        for (outer, n, inner) in [(3usize, 7usize, 1usize), (2, 7, 4), (1, 7, 1)] {
            let x: Vec<f32> = (0..outer * n * inner).map(|i| i as f32).collect();
            let xt = Tensor::from_f32(vec![outer, n, inner], x.clone()).unwrap();
            for idx in lists {
                let it = Tensor::new(vec![idx.len()], Storage::I64(idx.to_vec())).unwrap();
                let y = take(&xt, &it, Some(1), TakeMode::Fast).unwrap();
                let mut want = Vec::new();
                for o in 0..outer {
                    for &k in idx {
                        let k = if k < 0 { k + n as i64 } else { k } as usize;
                        want.extend_from_slice(&x[(o * n + k) * inner..][..inner]);
                    }
                }
                assert_eq!(y.shape(), &[outer, idx.len(), inner]);
                assert_eq!(y.to_f32_vec(), want, "{outer} × {n} × {inner}, {idx:?}");
                // The other dtypes' path (f32 fills a kept buffer), on the same values.
                let xi = Tensor::new(
                    vec![outer, n, inner],
                    Storage::I64(x.iter().map(|&v| v as i64).collect()),
                )
                .unwrap();
                let yi = take(&xi, &it, Some(1), TakeMode::Fast).unwrap();
                assert_eq!(yi.shape(), &[outer, idx.len(), inner]);
                assert_eq!(
                    yi.to_f32_vec(),
                    want,
                    "i64 {outer} × {n} × {inner}, {idx:?}"
                );
            }
        }
    }
}
