//! The `relax.image` kernels: `resize2d` (nearest / linear / cubic resampling of the two
//! spatial axes, in any permutation of `NCHW`, with TVM topi's coordinate transformations and
//! rounding rules), `grid_sample` (2-D and volumetric sampling at the positions of a
//! channel-first grid) and `affine_grid` (the grid of an affine transform).
//!
//! Contract:
//!
//! - `resize2d`: each output axis gets a table of (input index, weight) taps computed once
//!   ([`Resize2dAttrs::taps`], shared with the CUDA lowering); an output point is the separable
//!   sum over the two tables. Nearest copies elements exactly for every dtype; linear and cubic
//!   compute in `f64` and round once to the output dtype (to nearest for integer data). Points
//!   that `tf_crop_and_resize` maps outside the input take `extrapolation_value`.
//! - `grid_sample` follows ONNX's `GridSample` (its reference and onnxruntime; PyTorch and TVM
//!   differ only for `bicubic` with `border`, see `fusebox_core::op`'s image ops): each normalised
//!   coordinate is mapped to the input (`align_corners`: -1 and 1 at the corner pixels'
//!   centres, else at their outer edges) in the data's precision (`f32` below `float64`, as
//!   the reference does); `nearest` rounds half to even; a coordinate outside the borders is
//!   clamped (`border`) or mirrored (`reflection`) first, and every tap outside the input reads
//!   0, the edge pixel or its mirror image by the padding mode. Linear taps are the two
//!   neighbours, cubic ones the four of Keys's kernel with `a = -0.75`; the per-axis weights
//!   multiply, innermost axis first, in `f64`, rounded once to the data's dtype. Non-finite
//!   coordinates give NaN or padding, never an out-of-range read.
//! - `affine_grid`: `grid[n, k, p] = Σ_j theta[n, k, j] · base_j(p) + theta[n, k, r]` over the
//!   base positions of [`affine_grid_base`] (`x` along the last axis), in `f64`.
//! - Sizes are checked, never trusted.
//!
//! ```text
//! y: R.Tensor((1, 1, 4, 4), dtype="float32") = R.image.resize2d(x, R.shape([4, 4]),
//!     method="linear", coordinate_transformation_mode="half_pixel")
//! g: R.Tensor((1, 2, 3, 3), dtype="float32") = R.image.affine_grid(theta, R.shape([3, 3]),
//!     align_corners=False)
//! z: R.Tensor((1, 1, 3, 3), dtype="float32") = R.image.grid_sample(x, g, method="bicubic",
//!     layout="NCHW", padding_mode="border", align_corners=False)
//! ```

use crate::nn::layout4;
use crate::util::{KResult, from_canonical, from_f64, map_same, numel, tensor, to_canonical};
use fusebox_core::ir::DType;
use fusebox_core::op::{GridSampleAttrs, Resize2dAttrs, affine_grid_base};
use fusebox_core::runtime::Tensor;

fn size_of(v: i64, what: &str) -> KResult<usize> {
    usize::try_from(v)
        .ok()
        .filter(|&v| v >= 1)
        .ok_or_else(|| format!("expected the output {what} to be at least 1, found {v}"))
}

/// `resize2d(x, size)`.
pub(crate) fn resize2d(x: &Tensor, size: &[i64], a: &Resize2dAttrs) -> KResult<Tensor> {
    if x.rank() != 4 {
        return Err(format!("expected a 4-D input, found shape {:?}", x.shape()));
    }
    let [oh, ow] = match size {
        [h, w] => [size_of(*h, "height")?, size_of(*w, "width")?],
        _ => {
            return Err(format!(
                "expected the size to have 2 values (height, width), found {size:?}"
            ));
        }
    };
    let pos = layout4(&a.layout, "NCHW")?;
    let xc = to_canonical(x, pos);
    let &[n, c, ih, iw] = xc.shape() else {
        return Err("internal: canonical shape is not 4-D".to_string());
    };
    if ih == 0 || iw == 0 {
        return Err(format!("cannot resize an empty image {:?}", x.shape()));
    }
    let out_shape = vec![n, c, oh, ow];
    let total = numel(&out_shape)?;
    a.check_extent(0, ih, oh)?;
    a.check_extent(1, iw, ow)?;
    let th = a.taps(0, ih, oh);
    let tw = a.taps(1, iw, ow);
    let out_dtype = a.out_dtype.unwrap_or(x.dtype());
    let plane_in = ih * iw;
    let all_single = th
        .iter()
        .chain(tw.iter())
        .all(|t| matches!(t, Some(v) if v.len() == 1));
    let y = if a.method == "nearest_neighbor" && all_single {
        // An exact gather, for every dtype.
        let mut idx = Vec::with_capacity(total);
        for p in 0..n * c {
            for h in th.iter().flatten() {
                for w in tw.iter().flatten() {
                    idx.push(p * plane_in + h[0].0 * iw + w[0].0);
                }
            }
        }
        let data = map_same!(xc.storage(), v => idx.iter().map(|&i| v[i]).collect());
        tensor(out_shape, data)?
    } else {
        let xs = xc.to_f64_vec();
        let ext = a.extrapolation_value.0;
        let mut out = Vec::with_capacity(total);
        for p in 0..n * c {
            let plane = &xs[p * plane_in..(p + 1) * plane_in];
            for h in &th {
                for w in &tw {
                    let (Some(h), Some(w)) = (h, w) else {
                        out.push(ext);
                        continue;
                    };
                    let mut acc = 0.0;
                    for &(hi, hw) in h {
                        for &(wi, ww) in w {
                            acc += hw * ww * plane[hi * iw + wi];
                        }
                    }
                    out.push(acc);
                }
            }
        }
        if !x.dtype().is_float() {
            // Integer data: round to nearest (half away from zero), not truncate.
            out.iter_mut().for_each(|v| *v = v.round());
        }
        from_f64(out_shape, x.dtype(), out)?
    };
    let y = if out_dtype == y.dtype() {
        y
    } else {
        crate::elementwise::astype(&y, out_dtype)
    };
    Ok(from_canonical(&y, pos))
}

/// The most taps one output point reads along one axis (cubic).
const MAX_TAPS: usize = 4;

/// The taps of one sample position along one axis: input indices (`None`: a zero of the
/// `zeros` padding) and their weights.
#[derive(Clone, Copy)]
struct AxisTaps {
    len: usize,
    idx: [Option<usize>; MAX_TAPS],
    w: [f64; MAX_TAPS],
}

impl AxisTaps {
    /// No taps yet.
    const EMPTY: AxisTaps = AxisTaps {
        len: 0,
        idx: [None; MAX_TAPS],
        w: [0.0; MAX_TAPS],
    };
}

/// One axis of a `grid_sample`: the input extent and the attributes that map a normalised
/// coordinate onto it.
struct Axis<'a> {
    size: usize,
    a: &'a GridSampleAttrs,
    /// Map coordinates in `f32` (the data is not `float64`).
    single: bool,
}

impl Axis<'_> {
    /// Rounds to the coordinate precision.
    fn q(&self, v: f64) -> f64 {
        if self.single { f64::from(v as f32) } else { v }
    }

    /// The normalised coordinate `g` on the input axis (ONNX's `_gs_denormalize`).
    fn denormalize(&self, g: f64) -> f64 {
        let n = self.size as f64;
        if self.single {
            let (g, n) = (g as f32, n as f32);
            f64::from(if self.a.align_corners {
                (g + 1.0) / 2.0 * (n - 1.0)
            } else {
                ((g + 1.0) * n - 1.0) / 2.0
            })
        } else if self.a.align_corners {
            (g + 1.0) / 2.0 * (n - 1.0)
        } else {
            ((g + 1.0) * n - 1.0) / 2.0
        }
    }

    /// The borders a coordinate is reflected at: the corner centres, or their outer edges.
    fn borders(&self) -> (f64, f64) {
        let n = self.size as f64;
        if self.a.align_corners {
            (0.0, n - 1.0)
        } else {
            (-0.5, n - 0.5)
        }
    }

    /// `x` mirrored at the borders until it lies within them.
    fn reflect(&self, x: f64) -> f64 {
        let (lo, hi) = self.borders();
        let range = hi - lo;
        if !x.is_finite() {
            return f64::NAN;
        }
        if range <= 0.0 {
            return lo;
        }
        let (dx, from_lo) = if x < lo {
            (lo - x, true)
        } else if x > hi {
            (x - hi, false)
        } else {
            return x;
        };
        let flips = (dx / range).trunc();
        let r = dx - flips * range;
        // An even number of flips leaves x on the side it left from.
        if (flips % 2.0 == 0.0) == from_lo {
            lo + r
        } else {
            hi - r
        }
    }

    /// The input index a tap at integer position `i` reads under the padding mode.
    fn pick(&self, i: f64) -> Option<usize> {
        if !i.is_finite() {
            return None;
        }
        let last = self.size as f64 - 1.0;
        let j = match self.a.padding_mode.as_str() {
            "border" => i.clamp(0.0, last),
            "reflection" => self.reflect(i).trunc().clamp(0.0, last),
            _ if (0.0..=last).contains(&i) => i,
            _ => return None,
        };
        // `j` is a whole number in `0..size`.
        Some(j as usize)
    }

    /// The taps of normalised coordinate `g`.
    fn taps(&self, g: f64) -> AxisTaps {
        let mut x = self.denormalize(g);
        let nearest = self.a.method == "nearest";
        if nearest {
            x = x.round_ties_even();
        }
        let (lo, hi) = self.borders();
        if x < lo || x > hi {
            match self.a.padding_mode.as_str() {
                "border" => x = x.clamp(0.0, self.size as f64 - 1.0),
                "reflection" => x = self.q(self.reflect(x)),
                _ => {}
            }
        }
        let mut t = AxisTaps::EMPTY;
        let mut push = |i: f64, w: f64| {
            if t.len < MAX_TAPS {
                t.idx[t.len] = self.pick(i);
                t.w[t.len] = w;
                t.len += 1;
            }
        };
        if nearest {
            push(x.trunc(), 1.0);
            return t;
        }
        let x0 = x.floor();
        let f = self.q(x - x0);
        if self.a.method == "bicubic" {
            const A: f64 = -0.75;
            // Keys's kernel at the distances f + 1, f, 1 - f and 2 - f.
            let far = |d: f64| ((A * d - 5.0 * A) * d + 8.0 * A) * d - 4.0 * A;
            let near = |d: f64| ((A + 2.0) * d - (A + 3.0)) * d * d + 1.0;
            push(x0 - 1.0, far(f + 1.0));
            push(x0, near(f));
            push(x0 + 1.0, near(1.0 - f));
            push(x0 + 2.0, far(2.0 - f));
        } else {
            push(x0, 1.0 - f);
            push(x0 + 1.0, f);
        }
        t
    }
}

/// `grid_sample(x, grid)` (see the module doc): `x` is `(N, C, *in)`, `grid` `(N, r, *out)`.
pub(crate) fn grid_sample(x: &Tensor, grid: &Tensor, a: &GridSampleAttrs) -> KResult<Tensor> {
    let r = a.spatial();
    let (xs, gs) = (x.shape(), grid.shape());
    if xs.len() != r + 2 || gs.len() != r + 2 {
        return Err(format!(
            "expected data and grid of rank {} for layout {}, found shapes {xs:?} and {gs:?}",
            r + 2,
            a.layout
        ));
    }
    if gs[0] != xs[0] || gs[1] != r {
        return Err(format!(
            "expected a grid of shape ({}, {r}, ...) for data of shape {xs:?}, found {gs:?}",
            xs[0]
        ));
    }
    if !x.dtype().is_float() || !grid.dtype().is_float() {
        return Err(format!(
            "expected float data and grid, found {} and {}",
            x.dtype(),
            grid.dtype()
        ));
    }
    let (n, c) = (xs[0], xs[1]);
    let in_dims = &xs[2..];
    let mut out_shape = vec![n, c];
    out_shape.extend_from_slice(&gs[2..]);
    let total = numel(&out_shape)?;
    let points = numel(&gs[2..])?;
    let plane_in = numel(in_dims)?;
    if total == 0 {
        return from_f64(out_shape, x.dtype(), Vec::new());
    }
    if plane_in == 0 {
        return Err(format!("cannot sample an empty input of shape {xs:?}"));
    }
    let single = x.dtype() != DType::F64;
    // Grid channel k is the coordinate of spatial axis r - 1 - k (x along the last axis).
    let axes: Vec<Axis<'_>> = in_dims
        .iter()
        .map(|&size| Axis { size, a, single })
        .collect();
    let mut strides = vec![1usize; r];
    for d in (0..r.saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * in_dims[d + 1];
    }
    let xv = x.to_f64_vec();
    let gv = grid.to_f64_vec();
    let mut out = vec![0.0f64; total];
    let run = points.div_ceil(crate::par::threads() * 4).max(64);
    let tasks = crate::par::plane_runs(&mut out, points, run);
    let r_tasks: Result<(), String> = crate::par::run_tasks(
        tasks.into_iter().enumerate().collect(),
        crate::par::threads_for(total.saturating_mul(4usize.pow(r as u32)), 1 << 14),
        |(t, mut planes)| {
            let p0 = t * run;
            let mut taps = vec![AxisTaps::EMPTY; r];
            for b in 0..n {
                for k in 0..planes.first().map_or(0, |s| s.len()) {
                    let p = p0 + k;
                    for (d, ax) in axes.iter().enumerate() {
                        let g = gv[(b * r + (r - 1 - d)) * points + p];
                        taps[d] = ax.taps(g);
                    }
                    for ch in 0..c {
                        let src = &xv[(b * c + ch) * plane_in..(b * c + ch + 1) * plane_in];
                        let v = sample(src, &taps, &strides, 0, 0);
                        if let Some(slot) = planes.get_mut(b * c + ch).and_then(|s| s.get_mut(k)) {
                            *slot = v;
                        }
                    }
                }
            }
            Ok(())
        },
    );
    r_tasks?;
    from_f64(out_shape, x.dtype(), out)
}

/// The separable sum of `taps` over axes `d..` at flat offset `base`: the innermost axis
/// first, each outer axis weighting the sums of the inner ones.
fn sample(src: &[f64], taps: &[AxisTaps], strides: &[usize], d: usize, base: usize) -> f64 {
    let Some(t) = taps.get(d) else {
        return src.get(base).copied().unwrap_or(0.0);
    };
    let mut acc = 0.0;
    for j in 0..t.len {
        let v = match t.idx[j] {
            Some(i) => sample(src, taps, strides, d + 1, base + i * strides[d]),
            None => 0.0,
        };
        acc += t.w[j] * v;
    }
    acc
}

/// `affine_grid(theta, size)`: the channel-first grid `(N, r, *size)` of `theta` (`(N, r,
/// r + 1)`) over [`affine_grid_base`]'s positions.
pub(crate) fn affine_grid(theta: &Tensor, size: &[i64], align_corners: bool) -> KResult<Tensor> {
    let r = size.len();
    let ts = theta.shape();
    if !matches!(r, 2 | 3) || ts.len() != 3 || ts[1] != r || ts[2] != r + 1 {
        return Err(format!(
            "expected theta of shape (N, r, r + 1) and a size of r = 2 or 3 extents, found \
             {ts:?} and {size:?}"
        ));
    }
    if !theta.dtype().is_float() {
        return Err(format!("expected a float theta, found {}", theta.dtype()));
    }
    let dims: Vec<usize> = size
        .iter()
        .map(|&v| size_of(v, "grid extent"))
        .collect::<KResult<_>>()?;
    let n = ts[0];
    let mut out_shape = vec![n, r];
    out_shape.extend_from_slice(&dims);
    let total = numel(&out_shape)?;
    let points = numel(&dims)?;
    // Per spatial axis (outermost first) its base coordinates; x is the last axis.
    let base: Vec<Vec<f64>> = dims
        .iter()
        .map(|&d| affine_grid_base(d, align_corners))
        .collect();
    let tv = theta.to_f64_vec();
    let mut out = Vec::with_capacity(total);
    let mut pos = vec![0usize; r];
    for b in 0..n {
        for k in 0..r {
            let row = &tv[(b * r + k) * (r + 1)..(b * r + k + 1) * (r + 1)];
            pos.iter_mut().for_each(|p| *p = 0);
            for _ in 0..points {
                // Coordinate j (x, y, z) is spatial axis r - 1 - j.
                let mut v = 0.0;
                for (j, w) in row[..r].iter().enumerate() {
                    v += w * base[r - 1 - j][pos[r - 1 - j]];
                }
                out.push(v + row[r]);
                for d in (0..r).rev() {
                    pos[d] += 1;
                    if pos[d] < dims[d] {
                        break;
                    }
                    pos[d] = 0;
                }
            }
        }
    }
    from_f64(out_shape, theta.dtype(), out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use fusebox_core::ir::DType;
    use fusebox_core::op::F64;
    use fusebox_core::runtime::Storage;

    fn attrs(method: &str, mode: &str, rounding: &str) -> Resize2dAttrs {
        Resize2dAttrs {
            roi: [F64(0.0); 4],
            layout: "NCHW".into(),
            method: method.into(),
            coordinate_transformation_mode: mode.into(),
            rounding_method: rounding.into(),
            cubic_alpha: F64(-0.75),
            cubic_exclude: 0,
            extrapolation_value: F64(0.0),
            out_dtype: None,
            scale: None,
            antialias: false,
        }
    }

    fn t64(shape: &[usize], v: Vec<f64>) -> Tensor {
        Tensor::new(shape.to_vec(), Storage::F64(v)).unwrap_or_else(|e| panic!("{e}"))
    }

    fn img() -> Tensor {
        t64(&[1, 1, 2, 2], vec![1.0, 2.0, 3.0, 4.0])
    }

    #[test]
    fn nearest_asymmetric_floor_doubles_each_pixel() {
        let y = resize2d(
            &img(),
            &[4, 4],
            &attrs("nearest_neighbor", "asymmetric", "floor"),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            y.to_f64_vec(),
            vec![
                1.0, 1.0, 2.0, 2.0, 1.0, 1.0, 2.0, 2.0, 3.0, 3.0, 4.0, 4.0, 3.0, 3.0, 4.0, 4.0
            ]
        );
    }

    #[test]
    fn bilinear_half_pixel_matches_hand_values() {
        // Per axis 2 → 4 with half_pixel: x_in = -0.25, 0.25, 0.75, 1.25, clamped to [0, 1]:
        // weights of the second pixel 0, 0.25, 0.75, 1.
        let y = resize2d(&img(), &[4, 4], &attrs("linear", "half_pixel", "round"))
            .unwrap_or_else(|e| panic!("{e}"));
        let f = [0.0, 0.25, 0.75, 1.0];
        let mut want = Vec::new();
        for fy in f {
            for fx in f {
                let top = 1.0 + fx;
                let bottom = 3.0 + fx;
                want.push(top + (bottom - top) * fy);
            }
        }
        assert_eq!(y.to_f64_vec(), want);
    }

    #[test]
    fn align_corners_keeps_the_corners_and_cubic_reproduces_a_linear_ramp() {
        let x = t64(&[1, 1, 3, 3], (0..9).map(f64::from).collect());
        let y = resize2d(&x, &[5, 5], &attrs("linear", "align_corners", "round"))
            .unwrap_or_else(|e| panic!("{e}"));
        let v = y.to_f64_vec();
        assert_eq!((v[0], v[4], v[20], v[24]), (0.0, 2.0, 6.0, 8.0));
        assert!((v[12] - 4.0).abs() < 1e-12);
        // A linear ramp in the interior is reproduced exactly by the cubic kernel (its
        // weights sum to 1 and have first moment 0).
        let x = t64(&[1, 1, 1, 8], (0..8).map(f64::from).collect());
        let y = resize2d(&x, &[1, 15], &attrs("cubic", "align_corners", "round"))
            .unwrap_or_else(|e| panic!("{e}"));
        let v = y.to_f64_vec();
        for (o, got) in v.iter().enumerate().skip(2).take(10) {
            assert!((got - o as f64 * 0.5).abs() < 1e-9, "{o}: {got}");
        }
    }

    #[test]
    fn nearest_is_exact_for_every_dtype_and_linear_rounds_integers() {
        for dt in [
            DType::F16,
            DType::BF16,
            DType::F32,
            DType::F64,
            DType::I8,
            DType::U8,
            DType::I32,
            DType::I64,
            DType::Bool,
        ] {
            let x = img().cast(dt);
            let y = resize2d(
                &x,
                &[1, 1],
                &attrs("nearest_neighbor", "asymmetric", "floor"),
            )
            .unwrap_or_else(|e| panic!("{dt}: {e}"));
            assert_eq!(y.dtype(), dt);
            assert_eq!(y.shape(), &[1, 1, 1, 1]);
            assert_eq!(y.to_f64_vec(), vec![1.0], "{dt}");
        }
        let big = Tensor::new(vec![1, 1, 1, 2], Storage::I64(vec![i64::MAX, 7]))
            .unwrap_or_else(|e| panic!("{e}"));
        let y = resize2d(
            &big,
            &[1, 4],
            &attrs("nearest_neighbor", "asymmetric", "floor"),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            matches!(y.storage(), fusebox_core::runtime::StorageRef::I64(v) if v == [i64::MAX, i64::MAX, 7, 7])
        );
        let x = img().cast(DType::U8);
        let y = resize2d(&x, &[1, 3], &attrs("linear", "align_corners", "round"))
            .unwrap_or_else(|e| panic!("{e}"));
        // 1, 1.5, 2 → rounded to nearest.
        assert_eq!(y.to_f64_vec(), vec![1.0, 2.0, 2.0]);
    }

    #[test]
    fn crop_and_resize_extrapolates_and_layouts_permute() {
        let mut a = attrs("linear", "tf_crop_and_resize", "round");
        a.roi = [F64(0.0), F64(0.0), F64(2.0), F64(1.0)];
        a.extrapolation_value = F64(-9.0);
        let y = resize2d(&img(), &[3, 2], &a).unwrap_or_else(|e| panic!("{e}"));
        // Rows at x_in = 0, 1, 2 (the last is outside the 2-row input).
        assert_eq!(y.to_f64_vec(), vec![1.0, 2.0, 3.0, 4.0, -9.0, -9.0]);
        let mut n = attrs("nearest_neighbor", "asymmetric", "floor");
        n.layout = "NHWC".into();
        let x = t64(&[1, 2, 2, 1], vec![1.0, 2.0, 3.0, 4.0]);
        let y = resize2d(&x, &[4, 4], &n).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(y.shape(), &[1, 4, 4, 1]);
        assert_eq!(y.to_f64_vec()[..4], [1.0, 1.0, 2.0, 2.0]);
    }

    #[test]
    fn bad_sizes_are_errors() {
        let a = attrs("linear", "half_pixel", "round");
        assert!(resize2d(&img(), &[0, 2], &a).is_err_and(|e| e.contains("height")));
        assert!(resize2d(&img(), &[2], &a).is_err_and(|e| e.contains("2 values")));
        assert!(resize2d(&img(), &[2, -1], &a).is_err_and(|e| e.contains("width")));
        let x3 = t64(&[1, 2, 2], vec![1.0; 4]);
        assert!(resize2d(&x3, &[2, 2], &a).is_err_and(|e| e.contains("4-D")));
        let empty = t64(&[1, 1, 0, 2], vec![]);
        assert!(resize2d(&empty, &[2, 2], &a).is_err_and(|e| e.contains("empty")));
    }

    fn gs(method: &str, pad: &str, align: bool, layout: &str) -> GridSampleAttrs {
        GridSampleAttrs {
            method: method.into(),
            layout: layout.into(),
            padding_mode: pad.into(),
            align_corners: align,
        }
    }

    fn t32(shape: &[usize], v: Vec<f32>) -> Tensor {
        Tensor::new(shape.to_vec(), Storage::F32(v)).unwrap_or_else(|e| panic!("{e}"))
    }

    /// A deterministic pseudo-random sequence in [-1, 1).
    fn seq(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2_654_435_761).max(1);
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s % 20_000) as f32 / 10_000.0 - 1.0
            })
            .collect()
    }

    #[test]
    fn an_identity_affine_grid_samples_the_input_back() {
        let x = t32(&[2, 3, 3, 4], seq(72, 1));
        let theta = t32(&[2, 2, 3], [1.0, 0.0, 0.0, 0.0, 1.0, 0.0].repeat(2));
        for align in [false, true] {
            let g = affine_grid(&theta, &[3, 4], align).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(g.shape(), &[2, 2, 3, 4]);
            for method in ["nearest", "bilinear", "bicubic"] {
                for pad in ["zeros", "border", "reflection"] {
                    let y = grid_sample(&x, &g, &gs(method, pad, align, "NCHW"))
                        .unwrap_or_else(|e| panic!("{e}"));
                    assert_eq!(y.shape(), x.shape());
                    for (a, b) in y.to_f64_vec().iter().zip(x.to_f64_vec()) {
                        assert!((a - b).abs() < 1e-6, "{method} {pad} {align}: {a} vs {b}");
                    }
                }
            }
        }
    }

    /// Bilinear sampling written out directly: the four neighbours of each position, a
    /// neighbour outside the plane reading 0.
    fn bilinear_zeros(x: &[f32], h: usize, w: usize, gx: f64, gy: f64, align: bool) -> f64 {
        let unnorm = |g: f64, n: usize| {
            let n = n as f64;
            if align {
                (g + 1.0) * (n - 1.0) / 2.0
            } else {
                ((g + 1.0) * n - 1.0) / 2.0
            }
        };
        let (px, py) = (unnorm(gx, w), unnorm(gy, h));
        let (x0, y0) = (px.floor(), py.floor());
        let (fx, fy) = (px - x0, py - y0);
        let at = |yy: f64, xx: f64| {
            if yy < 0.0 || xx < 0.0 || yy >= h as f64 || xx >= w as f64 {
                0.0
            } else {
                f64::from(x[yy as usize * w + xx as usize])
            }
        };
        (1.0 - fy) * ((1.0 - fx) * at(y0, x0) + fx * at(y0, x0 + 1.0))
            + fy * ((1.0 - fx) * at(y0 + 1.0, x0) + fx * at(y0 + 1.0, x0 + 1.0))
    }

    #[test]
    fn bilinear_with_zero_padding_matches_its_direct_definition() {
        let (h, w, ho, wo) = (5, 6, 4, 7);
        let x = seq(h * w, 7);
        let g: Vec<f32> = seq(2 * ho * wo, 9).iter().map(|v| v * 1.4).collect();
        let xt = t32(&[1, 1, h, w], x.clone());
        let gt = t32(&[1, 2, ho, wo], g.clone());
        for align in [false, true] {
            let y = grid_sample(&xt, &gt, &gs("bilinear", "zeros", align, "NCHW"))
                .unwrap_or_else(|e| panic!("{e}"))
                .to_f64_vec();
            for p in 0..ho * wo {
                let want =
                    bilinear_zeros(&x, h, w, f64::from(g[p]), f64::from(g[ho * wo + p]), align);
                assert!((y[p] - want).abs() < 1e-5, "{p}: {} vs {want}", y[p]);
            }
        }
    }

    #[test]
    fn padding_modes_clamp_mirror_or_zero_what_lies_outside() {
        // One row of 3 pixels; grid y = 0 (the row's centre), x varies.
        let x = t32(&[1, 1, 1, 3], vec![10.0, 20.0, 40.0]);
        let at = |gx: f32, pad: &str, method: &str| {
            let g = t32(&[1, 2, 1, 1], vec![gx, 0.0]);
            grid_sample(&x, &g, &gs(method, pad, false, "NCHW"))
                .unwrap_or_else(|e| panic!("{e}"))
                .to_f64_vec()[0]
        };
        // gx = 1.5: x = ((2.5)·3 − 1)/2 = 3.25, past the edge at 2.5. Reflected at 2.5: 1.75,
        // a quarter of pixel 1 and three quarters of pixel 2.
        assert!((at(1.5, "reflection", "bilinear") - (0.25 * 20.0 + 0.75 * 40.0)).abs() < 1e-5);
        // Clamped to the last pixel.
        assert!((at(1.5, "border", "bilinear") - 40.0).abs() < 1e-6);
        // Far outside with zeros: nothing.
        assert_eq!(at(3.0, "zeros", "bilinear"), 0.0);
        // gx = -1 lands on the outer edge of pixel 0 (x = -0.5): half of pixel 0 with zeros,
        // all of it with border.
        assert!((at(-1.0, "zeros", "bilinear") - 5.0).abs() < 1e-6);
        assert!((at(-1.0, "border", "bilinear") - 10.0).abs() < 1e-6);
        // Nearest rounds half to even: gx = -1/3 gives x = 0.5 → pixel 0.
        assert_eq!(at(-1.0 / 3.0, "zeros", "nearest"), 10.0);
        // Non-finite coordinates read padding or give NaN, never out of range.
        for pad in ["zeros", "border", "reflection"] {
            for method in ["nearest", "bilinear", "bicubic"] {
                for v in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1e30] {
                    let y = at(v, pad, method);
                    assert!(y.is_nan() || y.is_finite(), "{pad} {method} {v}: {y}");
                }
            }
        }
    }

    #[test]
    fn volumetric_sampling_reads_the_depth_axis_from_grid_channel_2() {
        // A (1, 1, 2, 2, 2) volume; sample the centre of the far (z = 1) face's first voxel.
        let x = t32(&[1, 1, 2, 2, 2], (0..8).map(|v| v as f32).collect());
        // align_corners: -1 and 1 are voxel centres; (x, y, z) = (-1, -1, 1) is voxel (1, 0, 0).
        let g = t32(&[1, 3, 1, 1, 1], vec![-1.0, -1.0, 1.0]);
        let y = grid_sample(&x, &g, &gs("bilinear", "zeros", true, "NCDHW"))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(y.shape(), &[1, 1, 1, 1, 1]);
        assert_eq!(y.to_f64_vec(), vec![4.0]);
        // The midpoint of everything: the mean.
        let g = t32(&[1, 3, 1, 1, 1], vec![0.0, 0.0, 0.0]);
        let y = grid_sample(&x, &g, &gs("bilinear", "border", true, "NCDHW"))
            .unwrap_or_else(|e| panic!("{e}"));
        assert!((y.to_f64_vec()[0] - 3.5).abs() < 1e-6);
    }

    #[test]
    fn results_do_not_depend_on_the_thread_count() {
        let x = t32(&[2, 3, 9, 11], seq(594, 3));
        let g = t32(
            &[2, 2, 13, 17],
            seq(884, 4).iter().map(|v| v * 1.2).collect(),
        );
        let a = gs("bicubic", "reflection", false, "NCHW");
        let one = crate::par::with_threads(1, || grid_sample(&x, &g, &a))
            .unwrap_or_else(|e| panic!("{e}"));
        let three = crate::par::with_threads(3, || grid_sample(&x, &g, &a))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(one.to_f64_vec(), three.to_f64_vec());
    }

    #[test]
    fn affine_grid_applies_theta_to_the_base_positions() {
        // 3-D: scale x by 2, translate z by 0.5.
        let theta = t32(
            &[1, 3, 4],
            vec![2.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.5],
        );
        let g = affine_grid(&theta, &[2, 1, 3], false).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(g.shape(), &[1, 3, 2, 1, 3]);
        let v = g.to_f64_vec();
        // x (channel 0) along the last axis: 2 · (-2/3, 0, 2/3), for both depths.
        let xs = [-4.0 / 3.0, 0.0, 4.0 / 3.0];
        for (i, want) in xs.iter().chain(xs.iter()).enumerate() {
            assert!((v[i] - want).abs() < 1e-6, "{i}");
        }
        // y (channel 1): the single row sits at 0.
        assert!(v[6..12].iter().all(|&y| y == 0.0));
        // z (channel 2): depth centres ∓0.5, plus 0.5.
        assert_eq!(&v[12..18], &[0.0, 0.0, 0.0, 1.0, 1.0, 1.0]);
    }

    #[test]
    fn bad_grids_and_thetas_are_errors() {
        let x = t32(&[1, 2, 3, 3], vec![0.0; 18]);
        let a = gs("bilinear", "zeros", false, "NCHW");
        let e = |g: &Tensor| grid_sample(&x, g, &a).err().unwrap_or_default();
        assert!(e(&t32(&[2, 2, 1, 1], vec![0.0; 4])).contains("grid of shape (1, 2"));
        assert!(e(&t32(&[1, 1, 2, 2, 2], vec![0.0; 8])).contains("rank 4"));
        assert!(e(&t32(&[1, 3, 1, 1], vec![0.0; 3])).contains("grid of shape"));
        let xi =
            Tensor::new(vec![1, 1, 1, 1], Storage::I32(vec![1])).unwrap_or_else(|e| panic!("{e}"));
        let g = t32(&[1, 2, 1, 1], vec![0.0; 2]);
        assert!(grid_sample(&xi, &g, &a).is_err_and(|e| e.contains("float")));
        let empty = t32(&[1, 1, 0, 3], vec![]);
        assert!(grid_sample(&empty, &g, &a).is_err_and(|e| e.contains("empty")));
        let theta = t32(&[1, 2, 3], vec![0.0; 6]);
        assert!(affine_grid(&theta, &[2, 2, 2], false).is_err_and(|e| e.contains("theta")));
        assert!(affine_grid(&theta, &[0, 2], false).is_err_and(|e| e.contains("at least 1")));
    }
}
