//! Stride-2 3×3 depthwise convolution read straight from the `NCHW` plane, with AVX-512 or
//! AVX2:
//! MobileNetV2's four stride-2 depthwise layers (96×112×112, 144×56×56, 192×28×28,
//! 576×14×14), which [`crate::depthwise_flat`] runs after dealing each plane into four phase
//! planes.
//!
//! Contract:
//!
//! - [`Plan::new`] takes a 3×3 kernel, stride 2 both ways, dilation 1, one pixel of padding at
//!   the top and left (any at the bottom and right: what lies past the image reads `+0.0`),
//!   and output rows of [`MIN_WIDTH`] pixels or more. Anything else is `None` and the caller
//!   keeps its other kernels.
//! - Output pixels `ox0 .. ox0 + 16` of row `oy` read, per kernel row `ky`, input row
//!   `r = 2·oy + ky − 1` from column `2·ox0` on: two vectors `A, B` (cut at the row's end, the
//!   rest `+0.0`). Kernel column 1 reads their even lanes, column 2 their odd lanes (one
//!   two-source permute each), column 0 the odd lanes one pixel to the left (a lane shift that
//!   brings in the previous block's last odd lane, `+0.0` left of the image). A row above or
//!   below the image is `+0.0`. So the plane is read once, in order, with no copy: the phase
//!   planes of [`crate::depthwise_flat`] cost a pass over the input that, in the model, waits on
//!   memory (the 96×112×112 layer's copies took 0.25–0.33 ms of its time).
//! - Each output element is the chain of its taps in `(ky, kx)` order, one FMA each from
//!   `+0.0`, a tap over the padding adding `0 · w`: the bits of [`crate::depthwise_flat`] and
//!   of the row kernel of [`crate::conv`] (tested, NaN and infinities included).
//!
//! ```text
//! y = R.nn.conv2d(x, w, strides=[2, 2], padding=[1, 1, 1, 1], groups=96)  # x: (1, 96, 112, 112)
//! ; each 56×56 output plane: 56 rows × 4 vectors (the last of 8 lanes) × 9 taps, read
//! ; from the input plane's rows 2·oy − 1 .. 2·oy + 1 directly
//! ```

/// The narrowest output rows this kernel takes (narrower ones fill too little of a vector: the
/// flat kernel of [`crate::depthwise_flat`] packs several rows into each).
pub(crate) const MIN_WIDTH: usize = 14;

/// Lanes of an AVX-512 `f32` vector.
const LANES: usize = 16;

/// A plane geometry this kernel takes: input `h × w`, output `oh × ow`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Plan {
    h: usize,
    w: usize,
    oh: usize,
    ow: usize,
}

impl Plan {
    /// The plan for `[h, w, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow]`, or `None` unless the
    /// kernel is 3×3 of stride 2 and dilation 1 with one pixel of padding at the top and left,
    /// the output rows are [`MIN_WIDTH`] or more, and the CPU has AVX-512 or AVX2.
    pub(crate) fn new(shape: crate::depthwise_flat::Shape) -> Option<Plan> {
        let [h, w, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow] = shape;
        let fits = (kh, kw, sh, sw, dh, dw, pt, pl) == (3, 3, 2, 2, 1, 1, 1, 1)
            && ow >= MIN_WIDTH
            && oh > 0
            && h > 0
            && w > 0;
        (fits && has_kernel()).then_some(Plan { h, w, oh, ow })
    }
}

/// Whether this CPU runs one of the kernels: AVX2 with FMA (8 lanes), which every AVX-512 CPU
/// [`plane`] takes has too.
pub(crate) fn has_kernel() -> bool {
    #[cfg(target_arch = "x86_64")]
    if pulp::x86::V3::try_new().is_some() {
        return true;
    }
    false
}

/// One output plane `dst` (`oh × ow`) of input plane `x` (`h × w`) and its taps `w` (9, in
/// `(ky, kx)` order). `false` (nothing written) when the slices do not have the plan's sizes
/// or the CPU lacks AVX-512 and AVX2. Inlined: call it inside [`crate::simd::dispatch`], so
/// that the intrinsics compile to single instructions.
#[inline(always)]
pub(crate) fn plane(plan: &Plan, x: &[f32], w: &[f32], dst: &mut [f32]) -> bool {
    let Ok(w) = <&[f32; 9]>::try_from(w) else {
        return false;
    };
    if x.len() != plan.h * plan.w || dst.len() != plan.oh * plan.ow {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    {
        if let Some(v4) = pulp::x86::V4::try_new() {
            plane_v4(v4, plan, x, w, dst);
            return true;
        }
        if let Some(v3) = pulp::x86::V3::try_new() {
            plane_v3(v3, plan, x, w, dst);
            return true;
        }
    }
    false
}

/// [`plane`] on AVX2 (8 lanes): the same reads and chains as [`plane_v4`], each kernel row's
/// two vectors split into even and odd columns by an in-lane shuffle and a cross-lane
/// permute, the odd ones shifted one pixel right by a lane-crossing align (lane 0 from the
/// previous block's lane 7).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn plane_v3(v3: pulp::x86::V3, plan: &Plan, x: &[f32], w: &[f32; 9], dst: &mut [f32]) {
    use std::arch::x86_64::__m256;
    const L: usize = 8;
    let Plan { h, w: iw, oh, ow } = *plan;
    let zero: __m256 = pulp::cast([0.0f32; L]);
    let wv: [__m256; 9] = std::array::from_fn(|t| pulp::cast([w[t]; L]));
    let load = |row: &[f32], c: usize| pulp::cast(load_cut(v3, row, c));
    // Columns 2·i of `a, b` (16 values) in order, then columns 2·i + 1.
    let split = |a: __m256, b: __m256| -> (__m256, __m256) {
        let e = v3.avx._mm256_shuffle_ps::<0b10_00_10_00>(a, b);
        let o = v3.avx._mm256_shuffle_ps::<0b11_01_11_01>(a, b);
        let order = |q: __m256| -> __m256 {
            pulp::cast(
                v3.avx2
                    ._mm256_permute4x64_pd::<0b11_01_10_00>(pulp::cast(q)),
            )
        };
        (order(e), order(o))
    };
    for oy in 0..oh {
        let rows = kernel_rows(x, h, iw, oy);
        // Each kernel row's odd columns of the previous block (column 2·ox0 − 1 is lane 7).
        let mut prev = [zero; 3];
        let out = &mut dst[oy * ow..(oy + 1) * ow];
        for ox0 in (0..ow).step_by(L) {
            let mut acc = zero;
            for (ky, row) in rows.iter().enumerate() {
                let (left, mid, right) = match row {
                    Some(row) => {
                        let (e, o) = split(load(row, 2 * ox0), load(row, 2 * ox0 + L));
                        // [prev 4..8, o 0..4], then per 128-bit half the 3 floats shifted
                        // in: lane 0 the previous block's lane 7, lanes 1.. o's 0..7.
                        let t = v3.avx._mm256_permute2f128_ps::<0x21>(prev[ky], o);
                        let l: __m256 = pulp::cast(
                            v3.avx2
                                ._mm256_alignr_epi8::<12>(pulp::cast(o), pulp::cast(t)),
                        );
                        prev[ky] = o;
                        (l, e, o)
                    }
                    None => (zero, zero, zero),
                };
                acc = v3.fma._mm256_fmadd_ps(left, wv[3 * ky], acc);
                acc = v3.fma._mm256_fmadd_ps(mid, wv[3 * ky + 1], acc);
                acc = v3.fma._mm256_fmadd_ps(right, wv[3 * ky + 2], acc);
            }
            store_cut(v3, out, ox0, pulp::cast(acc));
        }
    }
}

/// The input rows kernel rows 0, 1, 2 of output row `oy` read: `2·oy + ky − 1` of `x` (`h`
/// rows of `iw`), `None` above and below the image (the padding).
fn kernel_rows(x: &[f32], h: usize, iw: usize, oy: usize) -> [Option<&[f32]>; 3] {
    std::array::from_fn(|ky| {
        let r = (2 * oy + ky).checked_sub(1)?;
        (r < h).then(|| x.get(r * iw..(r + 1) * iw)).flatten()
    })
}

/// [`plane`] on AVX-512 (inlined into the function [`crate::simd::dispatch`] compiled for it).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn plane_v4(v4: pulp::x86::V4, plan: &Plan, x: &[f32], w: &[f32; 9], dst: &mut [f32]) {
    use std::arch::x86_64::{__m512, __m512i};
    let Plan { h, w: iw, oh, ow } = *plan;
    let f = v4.avx512f;
    let zero: __m512 = pulp::cast([0.0f32; LANES]);
    let wv: [__m512; 9] = std::array::from_fn(|t| pulp::cast([w[t]; LANES]));
    let even: __m512i = pulp::cast(std::array::from_fn::<u32, LANES, _>(|l| 2 * l as u32));
    let odd: __m512i = pulp::cast(std::array::from_fn::<u32, LANES, _>(|l| 2 * l as u32 + 1));
    let load = |row: &[f32], c: usize| pulp::cast(load_cut(v4, row, c));
    for oy in 0..oh {
        let rows = kernel_rows(x, h, iw, oy);
        // Each kernel row's odd lanes of the previous block (column 2·ox0 − 1 is lane 15).
        let mut prev = [zero; 3];
        let out = &mut dst[oy * ow..(oy + 1) * ow];
        for ox0 in (0..ow).step_by(LANES) {
            let mut acc = zero;
            for (ky, row) in rows.iter().enumerate() {
                let (left, mid, right) = match row {
                    Some(row) => {
                        let (a, b) = (load(row, 2 * ox0), load(row, 2 * ox0 + LANES));
                        let e = f._mm512_permutex2var_ps(a, even, b);
                        let o = f._mm512_permutex2var_ps(a, odd, b);
                        // Lane 0 from the previous block's lane 15, lanes 1.. from o.
                        let l: __m512 = pulp::cast(
                            f._mm512_alignr_epi32::<15>(pulp::cast(o), pulp::cast(prev[ky])),
                        );
                        prev[ky] = o;
                        (l, e, o)
                    }
                    None => (zero, zero, zero),
                };
                acc = f._mm512_fmadd_ps(left, wv[3 * ky], acc);
                acc = f._mm512_fmadd_ps(mid, wv[3 * ky + 1], acc);
                acc = f._mm512_fmadd_ps(right, wv[3 * ky + 2], acc);
            }
            // One store; masked at the row's end (a copy through the stack there would wait
            // for this vector's store, see `depthwise_flat::store_n`).
            store_cut(v4, out, ox0, pulp::cast(acc));
        }
    }
}

/// The vector of `row` at columns `c..c + lanes`, `+0.0` past the row's end (shared with
/// [`crate::depthwise_s1`]).
#[inline(always)]
pub(crate) fn load_cut<S: pulp::Simd>(simd: S, row: &[f32], c: usize) -> S::f32s {
    match row.get(c..c + S::F32_LANES) {
        Some(s) => bytemuck::pod_read_unaligned(bytemuck::cast_slice(s)),
        None => simd.partial_load_f32s(row.get(c..).unwrap_or(&[])),
    }
}

/// Stores `v` at columns `c..c + lanes` of `out`, cut at its end (nothing past it).
#[inline(always)]
pub(crate) fn store_cut<S: pulp::Simd>(simd: S, out: &mut [f32], c: usize, v: S::f32s) {
    match out.get_mut(c..c + S::F32_LANES) {
        Some(o) => o.copy_from_slice(bytemuck::cast_slice(std::slice::from_ref(&v))),
        None => {
            if let Some(o) = out.get_mut(c..) {
                simd.partial_store_f32s(o, v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::panic, reason = "test code: a failure is a panic")]

    use super::*;

    /// The definition, written apart from the kernel: each output is the chain of its nine
    /// taps in `(ky, kx)` order, one fused multiply-add each from `+0.0`, `0 · w` where the
    /// tap falls outside the image.
    fn definition(x: &[f32], h: usize, w: usize, wt: &[f32; 9], oh: usize, ow: usize) -> Vec<f32> {
        let mut y = vec![0.0f32; oh * ow];
        for oy in 0..oh {
            for ox in 0..ow {
                let mut acc = 0.0f32;
                for ky in 0..3 {
                    for kx in 0..3 {
                        let (r, c) = ((2 * oy + ky) as isize - 1, (2 * ox + kx) as isize - 1);
                        let inside = r >= 0 && c >= 0 && (r as usize) < h && (c as usize) < w;
                        let v = if inside {
                            x[r as usize * w + c as usize]
                        } else {
                            0.0
                        };
                        acc = v.mul_add(wt[3 * ky + kx], acc);
                    }
                }
                y[oy * ow + ox] = acc;
            }
        }
        y
    }

    #[test]
    fn planes_match_the_definition_bit_for_bit() {
        // MobileNetV2's four stride-2 planes; odd sizes (the last row and column read the
        // padding); rows of one vector and a bit; more padding at the bottom and right than
        // the image needs (extra output rows and columns over zeros).
        for (h, w, oh, ow) in [
            (112, 112, 56, 56),
            (56, 56, 28, 28),
            (28, 28, 14, 14),
            (113, 57, 57, 29),
            (31, 34, 16, 17),
            (5, 40, 4, 21),
            (1, 28, 1, 14),
        ] {
            let Some(plan) = Plan::new([h, w, 3, 3, 2, 2, 1, 1, 1, 1, oh, ow]) else {
                // Only where the CPU has AVX-512 or AVX2; elsewhere the flat kernel runs.
                assert!(!has_kernel(), "{h}x{w}: no plan");
                continue;
            };
            let x: Vec<f32> = (0..h * w)
                .map(|i| match i % 97 {
                    5 => f32::NAN,
                    11 => f32::NEG_INFINITY,
                    _ => ((i * 7919) % 1013) as f32 / 97.0 - 5.0,
                })
                .collect();
            for wt in [
                std::array::from_fn(|t| t as f32 * 0.37 - 1.1),
                std::array::from_fn(|t| {
                    if t == 4 {
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
                let (took, y) = crate::simd::dispatch(Run(&plan, &x, &wt, oh * ow));
                assert!(took, "{h}x{w}: not taken");
                let want = definition(&x, h, w, &wt, oh, ow);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&y), bits(&want), "{h}x{w} -> {oh}x{ow}");
            }
        }
    }

    #[test]
    fn other_geometries_and_sizes_are_declined() {
        let s2 = [112, 112, 3, 3, 2, 2, 1, 1, 1, 1, 56, 56];
        let mut other = Vec::new();
        for (i, v) in [(4, 1), (2, 5), (6, 2), (8, 0), (9, 2), (11, 13)] {
            let mut s = s2;
            s[i] = v;
            other.push(s);
        }
        for s in other {
            assert_eq!(Plan::new(s), None, "{s:?}");
        }
        if let Some(plan) = Plan::new(s2) {
            let x = vec![1.0f32; 112 * 112];
            let mut y = vec![3.0f32; 56 * 56];
            assert!(!plane(&plan, &x[1..], &[1.0; 9], &mut y));
            assert!(!plane(&plan, &x, &[1.0; 8], &mut y));
            assert!(!plane(&plan, &x, &[1.0; 9], &mut y[1..]));
            assert!(y.iter().all(|&v| v == 3.0));
        }
    }
}
