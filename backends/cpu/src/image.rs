//! `relax.image.resize2d`: nearest / linear / cubic resampling of the two spatial axes, in any
//! permutation of `NCHW`, with TVM topi's coordinate transformations and rounding rules.
//!
//! Contract: each output axis gets a table of (input index, weight) taps computed once
//! ([`Resize2dAttrs::taps`], shared with the CUDA lowering); an output point is the separable
//! sum over the two tables. Nearest copies elements exactly for every dtype; linear and cubic
//! compute in `f64` and round once to the output dtype (to nearest for integer data). Points
//! that `tf_crop_and_resize` maps outside the input take `extrapolation_value`. Sizes are
//! checked, never trusted.
//!
//! ```text
//! y: R.Tensor((1, 1, 4, 4), dtype="float32") = R.image.resize2d(x, R.shape([4, 4]),
//!     method="linear", coordinate_transformation_mode="half_pixel")
//! ```

use crate::nn::layout4;
use crate::util::{KResult, from_canonical, from_f64, map_same, numel, tensor, to_canonical};
use fusebox_core::op::Resize2dAttrs;
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
    let r = &a.roi;
    let th = a.taps(ih, oh, (r[0].0, r[2].0));
    let tw = a.taps(iw, ow, (r[1].0, r[3].0));
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
        assert!(matches!(y.storage(), Storage::I64(v) if v == &vec![i64::MAX, i64::MAX, 7, 7]));
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
}
