//! Stride-1 "same" 3×3 depthwise convolution read straight from the `NCHW` plane, with
//! AVX-512 or AVX2 (vectors of 16 or 8 columns): MobileNetV2's stride-1 depthwise layers on
//! planes of 16 pixels wide or more (32×112×112 and 144×56×56 where the model stays in
//! `NCHW`), which [`crate::depthwise_flat`] runs after copying each plane into a
//! zero-margined buffer.
//!
//! Contract:
//!
//! - [`Plan::new`] takes a 3×3 kernel, stride 1 and dilation 1 both ways, one pixel of
//!   padding on every side (the output the input's size) and rows of [`MIN_WIDTH`] pixels or
//!   more, on a CPU with AVX-512 or AVX2. Anything else is `None` and the caller keeps its
//!   other kernels.
//! - The plane is walked in strips of one or two vectors of 16 output columns, each strip's
//!   rows top to bottom as in [`crate::depthwise_flat`]'s strips: input row `j` is loaded once
//!   (its vector at the strip, the one before and the one after, cut at the row's end, `+0.0`
//!   past it), its left and right neighbours made by lane shifts (`+0.0` left of column 0 and
//!   right of the last column), and it is multiplied into the three output rows that read it:
//!   `j + 1` by kernel row 0, `j` by row 1, `j − 1` by row 2, which is then complete and
//!   stored. Rows above and below the image are `+0.0`. So the plane is read where it lies, with
//!   no copy: the copy into the flat kernel's buffer waited on memory before any multiply
//!   could start, where here the loads of a row overlap the multiply-adds of the one before.
//! - Each output element is the chain of its taps in `(ky, kx)` order, one FMA each from
//!   `+0.0`, a tap over the padding adding `0 · w`: the bits of [`crate::depthwise_flat`] and
//!   of the row kernel of [`crate::conv`] (tested against the definition, NaN and infinities
//!   included).
//!
//! ```text
//! y = R.nn.conv2d(x, w, strides=[1, 1], padding=[1, 1, 1, 1], groups=144)  # x: (1, 144, 56, 56)
//! ; each plane: strips of columns 0..32 and 32..56, 58 input rows each (the image's 56 and
//! ; a zero row above and below), per row 4 loads and 18 FMAs per strip of two vectors
//! ```

/// The narrowest rows this kernel takes (narrower ones fill too little of a vector: the flat
/// kernel packs several rows into each).
pub(crate) const MIN_WIDTH: usize = 16;

/// Lanes of an AVX-512 `f32` vector.
const LANES: usize = 16;

/// A plane geometry this kernel takes: `h × w` in and out.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Plan {
    h: usize,
    w: usize,
}

impl Plan {
    /// The plan for `[h, w, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow]`, or `None` unless the
    /// kernel is 3×3, stride 1 and dilation 1 with one pixel of padding on every side (the
    /// output `h × w`), the rows [`MIN_WIDTH`] pixels or more, and the CPU has AVX-512 or
    /// AVX2.
    pub(crate) fn new(shape: crate::depthwise_flat::Shape) -> Option<Plan> {
        let [h, w, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow] = shape;
        let fits = (kh, kw, sh, sw, dh, dw, pt, pl) == (3, 3, 1, 1, 1, 1, 1, 1)
            && (oh, ow) == (h, w)
            && w >= MIN_WIDTH
            && h > 0;
        (fits && crate::depthwise_s2::has_kernel()).then_some(Plan { h, w })
    }
}

/// One output plane `dst` (`h × w`) of input plane `x` (`h × w`) and its taps `w` (9, in
/// `(ky, kx)` order). `false` (nothing written) when the slices do not have the plan's sizes
/// or the CPU lacks AVX-512 and AVX2. Inlined: call it inside [`crate::simd::dispatch`], so
/// that the intrinsics compile to single instructions.
#[inline(always)]
pub(crate) fn plane(plan: &Plan, x: &[f32], w: &[f32], dst: &mut [f32]) -> bool {
    let Ok(w) = <&[f32; 9]>::try_from(w) else {
        return false;
    };
    if x.len() != plan.h * plan.w || dst.len() != x.len() {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    if let Some(v4) = pulp::x86::V4::try_new() {
        let vectors = plan.w.div_ceil(LANES);
        let mut v0 = 0;
        while v0 < vectors {
            if vectors - v0 >= 2 {
                strip_v4::<2>(v4, plan, x, w, v0, dst);
                v0 += 2;
            } else {
                strip_v4::<1>(v4, plan, x, w, v0, dst);
                v0 += 1;
            }
        }
        return true;
    }
    #[cfg(target_arch = "x86_64")]
    if let Some(v3) = pulp::x86::V3::try_new() {
        let vectors = plan.w.div_ceil(LANES_V3);
        let mut v0 = 0;
        while v0 < vectors {
            if vectors - v0 >= 2 {
                strip_v3::<2>(v3, plan, x, w, v0, dst);
                v0 += 2;
            } else {
                strip_v3::<1>(v3, plan, x, w, v0, dst);
                v0 += 1;
            }
        }
        return true;
    }
    false
}

/// Lanes of an AVX2 `f32` vector.
const LANES_V3: usize = 8;

/// [`strip_v4`] on AVX2 (8 lanes): the same loads and chains, the neighbours shifted in across
/// the two 128-bit halves by a permute and an align.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn strip_v3<const VS: usize>(
    v3: pulp::x86::V3,
    plan: &Plan,
    x: &[f32],
    w: &[f32; 9],
    v0: usize,
    dst: &mut [f32],
) {
    use std::arch::x86_64::__m256;
    const L: usize = LANES_V3;
    let Plan { h, w: iw } = *plan;
    let fma = v3.fma;
    let zero: __m256 = pulp::cast([0.0f32; L]);
    let wv: [__m256; 9] = std::array::from_fn(|t| pulp::cast([w[t]; L]));
    let load = |row: &[f32], c: usize| pulp::cast(crate::depthwise_s2::load_cut(v3, row, c));
    // [a[7], b[0..7]] and [a[1..8], b[0]] of consecutive vectors a, b.
    let right_by_one = |a: __m256, b: __m256| -> __m256 {
        let t = v3.avx._mm256_permute2f128_ps::<0x21>(a, b);
        pulp::cast(
            v3.avx2
                ._mm256_alignr_epi8::<12>(pulp::cast(b), pulp::cast(t)),
        )
    };
    let left_by_one = |a: __m256, b: __m256| -> __m256 {
        let t = v3.avx._mm256_permute2f128_ps::<0x21>(a, b);
        pulp::cast(
            v3.avx2
                ._mm256_alignr_epi8::<4>(pulp::cast(t), pulp::cast(a)),
        )
    };
    let c0 = v0 * L;
    // Output rows j − 2 and j − 1, partial (rows above the plane are computed and dropped).
    let (mut two, mut one) = ([zero; VS], [zero; VS]);
    for j in 0..h + 2 {
        // Input row j − 1 (`+0.0` above and below the image), its vectors at the strip, one
        // before (column c0 − 1 is its lane 7) and one after (column c0 + 8·VS is its lane 0).
        let (mut x0, mut x1, mut x2) = ([zero; VS], [zero; VS], [zero; VS]);
        let r = j.checked_sub(1).filter(|&r| r < h);
        if let Some(row) = r.and_then(|r| x.get(r * iw..(r + 1) * iw)) {
            let mid: [__m256; VS] = std::array::from_fn(|v| load(row, c0 + v * L));
            let before = match c0.checked_sub(L) {
                Some(c) => load(row, c),
                None => zero,
            };
            let after = load(row, c0 + VS * L);
            for v in 0..VS {
                let prev = if v == 0 { before } else { mid[v - 1] };
                let next = if v + 1 == VS { after } else { mid[v + 1] };
                x0[v] = right_by_one(prev, mid[v]);
                x1[v] = mid[v];
                x2[v] = left_by_one(mid[v], next);
            }
        }
        let mut new = [zero; VS];
        for v in 0..VS {
            two[v] = fma._mm256_fmadd_ps(x0[v], wv[6], two[v]);
            two[v] = fma._mm256_fmadd_ps(x1[v], wv[7], two[v]);
            two[v] = fma._mm256_fmadd_ps(x2[v], wv[8], two[v]);
            one[v] = fma._mm256_fmadd_ps(x0[v], wv[3], one[v]);
            one[v] = fma._mm256_fmadd_ps(x1[v], wv[4], one[v]);
            one[v] = fma._mm256_fmadd_ps(x2[v], wv[5], one[v]);
            new[v] = fma._mm256_fmadd_ps(x0[v], wv[0], new[v]);
            new[v] = fma._mm256_fmadd_ps(x1[v], wv[1], new[v]);
            new[v] = fma._mm256_fmadd_ps(x2[v], wv[2], new[v]);
        }
        // Output row j − 2 has its three kernel rows.
        if let Some(y) = j.checked_sub(2)
            && let Some(out) = dst.get_mut(y * iw..(y + 1) * iw)
        {
            for (v, &acc) in two.iter().enumerate() {
                crate::depthwise_s2::store_cut(v3, out, c0 + v * L, pulp::cast(acc));
            }
        }
        two = one;
        one = new;
    }
}

/// The output columns of vectors `v0 .. v0 + VS` of every row (see the module doc).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn strip_v4<const VS: usize>(
    v4: pulp::x86::V4,
    plan: &Plan,
    x: &[f32],
    w: &[f32; 9],
    v0: usize,
    dst: &mut [f32],
) {
    use std::arch::x86_64::__m512;
    let Plan { h, w: iw } = *plan;
    let f = v4.avx512f;
    let zero: __m512 = pulp::cast([0.0f32; LANES]);
    let wv: [__m512; 9] = std::array::from_fn(|t| pulp::cast([w[t]; LANES]));
    let load = |row: &[f32], c: usize| pulp::cast(crate::depthwise_s2::load_cut(v4, row, c));
    let c0 = v0 * LANES;
    // Output rows j − 2 and j − 1, partial (rows above the plane are computed and dropped).
    let (mut two, mut one) = ([zero; VS], [zero; VS]);
    for j in 0..h + 2 {
        // Input row j − 1 (`+0.0` above and below the image), its vectors at the strip, one
        // before (column c0 − 1 is its lane 15) and one after (column c0 + 16·VS is its lane 0).
        let (mut x0, mut x1, mut x2) = ([zero; VS], [zero; VS], [zero; VS]);
        let r = j.checked_sub(1).filter(|&r| r < h);
        if let Some(row) = r.and_then(|r| x.get(r * iw..(r + 1) * iw)) {
            let mid: [__m512; VS] = std::array::from_fn(|v| load(row, c0 + v * LANES));
            let before = match c0.checked_sub(LANES) {
                Some(c) => load(row, c),
                None => zero,
            };
            let after = load(row, c0 + VS * LANES);
            for v in 0..VS {
                let prev = if v == 0 { before } else { mid[v - 1] };
                let next = if v + 1 == VS { after } else { mid[v + 1] };
                // [prev[15], mid[0..15]] and [mid[1..16], next[0]].
                x0[v] =
                    pulp::cast(f._mm512_alignr_epi32::<15>(pulp::cast(mid[v]), pulp::cast(prev)));
                x1[v] = mid[v];
                x2[v] =
                    pulp::cast(f._mm512_alignr_epi32::<1>(pulp::cast(next), pulp::cast(mid[v])));
            }
        }
        let mut new = [zero; VS];
        for v in 0..VS {
            two[v] = f._mm512_fmadd_ps(x0[v], wv[6], two[v]);
            two[v] = f._mm512_fmadd_ps(x1[v], wv[7], two[v]);
            two[v] = f._mm512_fmadd_ps(x2[v], wv[8], two[v]);
            one[v] = f._mm512_fmadd_ps(x0[v], wv[3], one[v]);
            one[v] = f._mm512_fmadd_ps(x1[v], wv[4], one[v]);
            one[v] = f._mm512_fmadd_ps(x2[v], wv[5], one[v]);
            new[v] = f._mm512_fmadd_ps(x0[v], wv[0], new[v]);
            new[v] = f._mm512_fmadd_ps(x1[v], wv[1], new[v]);
            new[v] = f._mm512_fmadd_ps(x2[v], wv[2], new[v]);
        }
        // Output row j − 2 has its three kernel rows.
        if let Some(y) = j.checked_sub(2)
            && let Some(out) = dst.get_mut(y * iw..(y + 1) * iw)
        {
            for (v, &acc) in two.iter().enumerate() {
                crate::depthwise_s2::store_cut(v4, out, c0 + v * LANES, pulp::cast(acc));
            }
        }
        two = one;
        one = new;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::panic, reason = "test code: a failure is a panic")]

    use super::*;

    /// The definition, written apart from the kernel: each output is the chain of its nine
    /// taps in `(ky, kx)` order, one fused multiply-add each from `+0.0`, `0 · w` where the
    /// tap falls outside the image.
    fn definition(x: &[f32], h: usize, w: usize, wt: &[f32; 9]) -> Vec<f32> {
        let mut y = vec![0.0f32; h * w];
        for oy in 0..h {
            for ox in 0..w {
                let mut acc = 0.0f32;
                for ky in 0..3 {
                    for kx in 0..3 {
                        let (r, c) = ((oy + ky) as isize - 1, (ox + kx) as isize - 1);
                        let inside = r >= 0 && c >= 0 && (r as usize) < h && (c as usize) < w;
                        let v = if inside {
                            x[r as usize * w + c as usize]
                        } else {
                            0.0
                        };
                        acc = v.mul_add(wt[3 * ky + kx], acc);
                    }
                }
                y[oy * w + ox] = acc;
            }
        }
        y
    }

    #[test]
    fn planes_match_the_definition_bit_for_bit() {
        // MobileNetV2's planes; rows of one vector, of one and a bit, of whole strips and of
        // a strip and a vector; one row; a tall thin plane.
        for (h, w) in [
            (112, 112),
            (56, 56),
            (28, 28),
            (5, 16),
            (7, 17),
            (9, 32),
            (4, 48),
            (1, 40),
            (33, 21),
        ] {
            let Some(plan) = Plan::new([h, w, 3, 3, 1, 1, 1, 1, 1, 1, h, w]) else {
                // Only where the CPU has AVX-512 or AVX2; elsewhere the flat kernel runs.
                assert!(!crate::depthwise_s2::has_kernel(), "{h}x{w}: no plan");
                continue;
            };
            let x: Vec<f32> = (0..h * w)
                .map(|i| match i % 89 {
                    5 => f32::NAN,
                    11 => f32::NEG_INFINITY,
                    17 => -0.0,
                    _ => ((i * 7919) % 1013) as f32 / 97.0 - 5.0,
                })
                .collect();
            for wt in [
                std::array::from_fn(|t| t as f32 * 0.37 - 1.1),
                // An infinite weight: the padding taps give NaN at the edges (`0 · ∞`).
                std::array::from_fn(|t| {
                    if t == 2 {
                        f32::INFINITY
                    } else {
                        0.5 - t as f32
                    }
                }),
            ] {
                struct Run<'a>(&'a Plan, &'a [f32], &'a [f32; 9], usize);
                impl pulp::WithSimd for Run<'_> {
                    type Output = (bool, Vec<f32>);
                    #[inline(always)]
                    fn with_simd<S: pulp::Simd>(self, _: S) -> Self::Output {
                        let Run(plan, x, wt, n) = self;
                        let mut y = vec![7.0f32; n];
                        (plane(plan, x, wt, &mut y), y)
                    }
                }
                let (took, y) = crate::simd::dispatch(Run(&plan, &x, &wt, h * w));
                assert!(took, "{h}x{w}: not taken");
                let want = definition(&x, h, w, &wt);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&y), bits(&want), "{h}x{w}");
            }
        }
    }

    #[test]
    fn other_geometries_and_sizes_are_declined() {
        let s1 = [56, 56, 3, 3, 1, 1, 1, 1, 1, 1, 56, 56];
        let mut other = Vec::new();
        for (i, v) in [(2, 5), (4, 2), (6, 2), (8, 0), (9, 2), (10, 55), (1, 15)] {
            let mut s = s1;
            s[i] = v;
            if i == 1 {
                s[11] = v;
            }
            other.push(s);
        }
        for s in other {
            assert_eq!(Plan::new(s), None, "{s:?}");
        }
        if let Some(plan) = Plan::new(s1) {
            let x = vec![1.0f32; 56 * 56];
            let mut y = vec![3.0f32; 56 * 56];
            assert!(!plane(&plan, &x[1..], &[1.0; 9], &mut y));
            assert!(!plane(&plan, &x, &[1.0; 8], &mut y));
            assert!(!plane(&plan, &x, &[1.0; 9], &mut y[1..]));
            assert!(y.iter().all(|&v| v == 3.0));
        }
    }
}
