//! The `relax.vision.roi_align` kernel (see `fusebox_core::op`'s vision ops for the op's
//! definition): each box pooled to `PH × PW` bins of bilinear samples.
//!
//! Contract:
//!
//! - Per box, the sample points of every bin are laid out once (ONNX's and onnxruntime's
//!   "pre-calculation": four input offsets and four weights per point; a point more than one
//!   pixel outside the input has zero weights), then every channel reads them. A point inside
//!   that margin is clamped to the edge; the low corner is the clamped coordinate's floor and at
//!   the last row or column the point collapses onto it, exactly as ONNX's reference computes
//!   it (for `avg` and `max` this is TVM topi's clamp-then-interpolate).
//! - Coordinates, bin sizes and weights are computed in the data's precision (`f32` below
//!   `float64`, as the ONNX reference and onnxruntime do); the weighted sums and the average in
//!   `f64`, rounded once to the data's dtype.
//! - Values are checked, never trusted: a batch index that is not finite or falls outside the
//!   batch, and a box whose adaptive sampling would lay out more than [`MAX_POINTS`] points,
//!   are errors naming the box.
//!
//! ```text
//! y: R.Tensor((3, 16, 7, 7), dtype="float32") = R.vision.roi_align(x, rois,
//!     pooled_size=[7, 7], spatial_scale=0.25, sample_ratio=2, aligned=False, layout="NCHW",
//!     mode="avg")
//! ```

use crate::util::{KResult, from_f64, numel};
use fusebox_core::ir::DType;
use fusebox_core::op::RoiAlignAttrs;
use fusebox_core::runtime::Tensor;

/// The most sample points one box may lay out (all its bins together).
pub(crate) const MAX_POINTS: usize = 1 << 22;

/// One sample point: four offsets into a channel plane and their weights.
#[derive(Clone, Copy, Default)]
struct Point {
    pos: [usize; 4],
    w: [f64; 4],
}

/// How a bin combines its points.
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Avg,
    Max,
    OnnxMax,
}

/// `roi_align(x, rois)`: `x` is `(N, C, H, W)` (or `(N, H, W, C)`), `rois` `(R, 5)`.
pub(crate) fn roi_align(x: &Tensor, rois: &Tensor, a: &RoiAlignAttrs) -> KResult<Tensor> {
    let (xs, rs) = (x.shape(), rois.shape());
    if xs.len() != 4 || rs.len() != 2 || rs[1] != 5 {
        return Err(format!(
            "expected 4-D data and rois of shape (num_roi, 5), found {xs:?} and {rs:?}"
        ));
    }
    if !x.dtype().is_float() || !rois.dtype().is_float() {
        return Err(format!(
            "expected float data and rois, found {} and {}",
            x.dtype(),
            rois.dtype()
        ));
    }
    let nhwc = a.layout == "NHWC";
    let (n, c, h, w) = if nhwc {
        (xs[0], xs[3], xs[1], xs[2])
    } else {
        (xs[0], xs[1], xs[2], xs[3])
    };
    let [ph, pw] = a
        .pooled_size
        .map(|p| usize::try_from(p).unwrap_or(usize::MAX));
    let nr = rs[0];
    let out_shape = if nhwc {
        vec![nr, ph, pw, c]
    } else {
        vec![nr, c, ph, pw]
    };
    let total = numel(&out_shape)?;
    if total == 0 {
        return from_f64(out_shape, x.dtype(), Vec::new());
    }
    if h == 0 || w == 0 {
        return Err(format!("cannot sample an empty input of shape {xs:?}"));
    }
    let mode = match a.mode.as_str() {
        "avg" => Mode::Avg,
        "max" => Mode::Max,
        _ => Mode::OnnxMax,
    };
    let single = x.dtype() != DType::F64;
    let q = |v: f64| if single { f64::from(v as f32) } else { v };
    let xv = x.to_f64_vec();
    let rv = rois.to_f64_vec();
    let bins = ph * pw;
    let plane = h * w;
    let mut out = vec![0.0f64; total];
    let mut points: Vec<Point> = Vec::new();
    for r in 0..nr {
        let row = &rv[r * 5..r * 5 + 5];
        let b = row[0].trunc();
        if !(b.is_finite() && b >= 0.0 && b < n as f64) {
            return Err(format!(
                "roi {r}: batch index {} is outside the batch of {n}",
                row[0]
            ));
        }
        let b = b as usize;
        let scale = a.spatial_scale.0;
        let [x1, y1, x2, y2] = [row[1], row[2], row[3], row[4]].map(|v| q(v * scale));
        let (mut roi_w, mut roi_h) = (q(x2 - x1), q(y2 - y1));
        if !a.aligned {
            roi_w = roi_w.max(1.0);
            roi_h = roi_h.max(1.0);
        }
        let bin_h = q(roi_h / ph as f64);
        let bin_w = q(roi_w / pw as f64);
        // Sample points per bin along one axis; NaN and negative extents sample none, as the
        // reference's `int(ceil(..))` of a negative number gives an empty range.
        let grid = |extent: f64, bins: usize| -> f64 {
            if a.sample_ratio > 0 {
                a.sample_ratio as f64
            } else {
                let g = q(extent / bins as f64).ceil();
                if g > 0.0 { g } else { 0.0 }
            }
        };
        let (gh, gw) = (grid(roi_h, ph), grid(roi_w, pw));
        let (gh, gw) = if gh == 0.0 || gw == 0.0 {
            (0, 0)
        } else if gh * gw * bins as f64 <= MAX_POINTS as f64 {
            (gh as usize, gw as usize)
        } else {
            return Err(format!(
                "roi {r}: sampling {gh} × {gw} points in each of its {ph} × {pw} bins exceeds \
                 the {MAX_POINTS} points one box may sample (box {:?}, spatial_scale {scale})",
                &row[1..],
            ));
        };
        let count = gh * gw * bins;
        points.clear();
        points.reserve(count);
        for i in 0..ph {
            for j in 0..pw {
                for iy in 0..gh {
                    let yy =
                        q(q(y1 + q(i as f64 * bin_h))
                            + q(q((iy as f64 + 0.5) * bin_h) / gh as f64));
                    for ix in 0..gw {
                        let xx = q(q(x1 + q(j as f64 * bin_w))
                            + q(q((ix as f64 + 0.5) * bin_w) / gw as f64));
                        points.push(point(yy, xx, h, w, &q));
                    }
                }
            }
        }
        let per_bin = gh * gw;
        let norm = per_bin.max(1) as f64;
        for ch in 0..c {
            for bin in 0..bins {
                let pts = &points[bin * per_bin..(bin + 1) * per_bin];
                let read = |p: usize| {
                    if nhwc {
                        xv[(b * plane + p) * c + ch]
                    } else {
                        xv[(b * c + ch) * plane + p]
                    }
                };
                let v = match mode {
                    Mode::Avg => {
                        pts.iter()
                            .map(|p| (0..4).map(|k| p.w[k] * read(p.pos[k])).sum::<f64>())
                            .sum::<f64>()
                            / norm
                    }
                    Mode::Max => pts
                        .iter()
                        .map(|p| (0..4).map(|k| p.w[k] * read(p.pos[k])).sum::<f64>())
                        .reduce(f64::max)
                        .unwrap_or(0.0),
                    Mode::OnnxMax => pts
                        .iter()
                        .flat_map(|p| (0..4).map(|k| p.w[k] * read(p.pos[k])))
                        .reduce(f64::max)
                        .unwrap_or(0.0),
                };
                let o = if nhwc {
                    (r * bins + bin) * c + ch
                } else {
                    (r * c + ch) * bins + bin
                };
                out[o] = v;
            }
        }
    }
    from_f64(out_shape, x.dtype(), out)
}

/// The four taps of the point `(y, x)` of an `h × w` plane, by ONNX's border rule.
fn point(y: f64, x: f64, h: usize, w: usize, q: &impl Fn(f64) -> f64) -> Point {
    // NaN fails every comparison below and lands outside, as a non-finite box does in the
    // reference (its weights come out 0 there too).
    if !(y >= -1.0 && y <= h as f64 && x >= -1.0 && x <= w as f64) {
        return Point::default();
    }
    let axis = |v: f64, size: usize| -> (usize, usize, f64) {
        let v = v.max(0.0);
        let low = v as usize;
        if low >= size - 1 {
            (size - 1, size - 1, 0.0)
        } else {
            (low, low + 1, q(v - low as f64))
        }
    };
    let (y0, y1, ly) = axis(y, h);
    let (x0, x1, lx) = axis(x, w);
    let (hy, hx) = (q(1.0 - ly), q(1.0 - lx));
    Point {
        pos: [y0 * w + x0, y0 * w + x1, y1 * w + x0, y1 * w + x1],
        w: [q(hy * hx), q(hy * lx), q(ly * hx), q(ly * lx)],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fusebox_core::op::F64;
    use fusebox_core::runtime::Storage;

    fn t64(shape: &[usize], v: Vec<f64>) -> Tensor {
        Tensor::new(shape.to_vec(), Storage::F64(v)).unwrap_or_else(|e| panic!("{e}"))
    }

    fn attrs(pooled: [i64; 2], scale: f64, ratio: i64, aligned: bool, mode: &str) -> RoiAlignAttrs {
        RoiAlignAttrs {
            pooled_size: pooled,
            spatial_scale: F64(scale),
            sample_ratio: ratio,
            aligned,
            layout: "NCHW".into(),
            mode: mode.into(),
        }
    }

    /// Deterministic test values in [-1, 1) as `f64`.
    fn seq(n: usize, seed: u64) -> Vec<f64> {
        crate::util::test_values(n, seed)
            .into_iter()
            .map(f64::from)
            .collect()
    }

    /// TVM topi's `roi_align_nchw` written out as it reads: clamp the point into the plane,
    /// interpolate between `floor` and the next row/column (capped at the last), zero for a
    /// point beyond the one-pixel margin; average or take the largest interpolated value.
    fn topi(x: &[f64], xs: [usize; 4], rois: &[f64], a: &RoiAlignAttrs) -> Vec<f64> {
        let [_, c, h, w] = xs;
        let [ph, pw] = a.pooled_size.map(|p| p as usize);
        let bilinear = |b: usize, ch: usize, y: f64, xx: f64| -> f64 {
            if y < -1.0 || xx < -1.0 || y > h as f64 || xx > w as f64 {
                return 0.0;
            }
            let y = y.clamp(0.0, (h - 1) as f64);
            let xx = xx.clamp(0.0, (w - 1) as f64);
            let (y0, x0) = (y.floor() as usize, xx.floor() as usize);
            let (y1, x1) = ((y0 + 1).min(h - 1), (x0 + 1).min(w - 1));
            let (ly, lx) = (y - y0 as f64, xx - x0 as f64);
            let at = |i: usize, j: usize| x[((b * c + ch) * h + i) * w + j];
            (1.0 - ly) * (1.0 - lx) * at(y0, x0)
                + (1.0 - ly) * lx * at(y0, x1)
                + ly * (1.0 - lx) * at(y1, x0)
                + ly * lx * at(y1, x1)
        };
        let mut out = Vec::new();
        for roi in rois.chunks(5) {
            let b = roi[0] as usize;
            let s = a.spatial_scale.0;
            let (x1, y1, x2, y2) = (roi[1] * s, roi[2] * s, roi[3] * s, roi[4] * s);
            let (mut rh, mut rw) = (y2 - y1, x2 - x1);
            if !a.aligned {
                rh = rh.max(1.0);
                rw = rw.max(1.0);
            }
            let (bh, bw) = (rh / ph as f64, rw / pw as f64);
            let (gh, gw) = if a.sample_ratio > 0 {
                (a.sample_ratio as usize, a.sample_ratio as usize)
            } else {
                (
                    (rh / ph as f64).ceil() as usize,
                    (rw / pw as f64).ceil() as usize,
                )
            };
            for ch in 0..c {
                for i in 0..ph {
                    for j in 0..pw {
                        let mut vals = Vec::new();
                        for iy in 0..gh {
                            for ix in 0..gw {
                                let y = y1 + i as f64 * bh + (iy as f64 + 0.5) * bh / gh as f64;
                                let xx = x1 + j as f64 * bw + (ix as f64 + 0.5) * bw / gw as f64;
                                vals.push(bilinear(b, ch, y, xx));
                            }
                        }
                        out.push(match a.mode.as_str() {
                            "avg" => vals.iter().sum::<f64>() / vals.len().max(1) as f64,
                            _ => vals.into_iter().reduce(f64::max).unwrap_or(0.0),
                        });
                    }
                }
            }
        }
        out
    }

    fn run(x: &Tensor, rois: &Tensor, a: &RoiAlignAttrs) -> Vec<f64> {
        roi_align(x, rois, a)
            .unwrap_or_else(|e| panic!("{e}"))
            .to_f64_vec()
    }

    #[test]
    fn avg_and_max_are_topi_s_definition() {
        let xs = [2, 3, 9, 7];
        let x = t64(&xs, seq(2 * 3 * 9 * 7, 5));
        // Boxes inside, across the borders, beyond them, thinner than a pixel, inverted.
        let rois = vec![
            0.0, 1.0, 1.0, 5.0, 6.0, //
            1.0, -3.0, -2.0, 4.0, 3.0, //
            1.0, 5.5, 7.0, 12.0, 14.0, //
            0.0, 2.2, 3.1, 2.4, 3.2, //
            1.0, 6.0, 5.0, 2.0, 1.0, //
            0.0, -9.0, -9.0, -5.0, -6.0,
        ];
        let r = t64(&[6, 5], rois.clone());
        for mode in ["avg", "max"] {
            for aligned in [false, true] {
                for ratio in [-1, 0, 1, 2, 3] {
                    for (pooled, scale) in [([2, 3], 1.0), ([3, 2], 0.5), ([1, 1], 2.0)] {
                        let a = attrs(pooled, scale, ratio, aligned, mode);
                        let got = run(&x, &r, &a);
                        let want = topi(&x.to_f64_vec(), xs, &rois, &a);
                        assert_eq!(got.len(), want.len());
                        for (k, (g, w)) in got.iter().zip(&want).enumerate() {
                            assert!(
                                (g - w).abs() < 1e-12,
                                "{mode} aligned={aligned} ratio={ratio} {pooled:?} x{scale}: \
                                 element {k}: {g} vs {w}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn onnx_max_takes_the_largest_weighted_corner_term() {
        // One point at (0.5, 0.5) of a 2×2 plane: each corner weighs 0.25.
        let x = t64(&[1, 1, 2, 2], vec![1.0, -2.0, 8.0, 4.0]);
        let r = t64(&[1, 5], vec![0.0, 0.0, 0.0, 1.0, 1.0]);
        let a = attrs([1, 1], 1.0, 1, true, "onnx_max");
        assert_eq!(run(&x, &r, &a), [2.0]);
        let tvm = attrs([1, 1], 1.0, 1, true, "max");
        assert_eq!(run(&x, &r, &tvm), [2.75]);
        // All negative: the largest term is the least negative weighted one.
        let neg = t64(&[1, 1, 2, 2], vec![-1.0, -2.0, -8.0, -4.0]);
        assert_eq!(run(&neg, &r, &a), [-0.25]);
    }

    #[test]
    fn nhwc_is_nchw_with_channels_last() {
        let (n, c, h, w) = (2, 4, 6, 5);
        let x = seq(n * c * h * w, 9);
        let mut xl = vec![0.0; x.len()];
        for b in 0..n {
            for ch in 0..c {
                for p in 0..h * w {
                    xl[(b * h * w + p) * c + ch] = x[(b * c + ch) * h * w + p];
                }
            }
        }
        let rois = t64(
            &[3, 5],
            vec![
                1.0, 0.5, 1.0, 4.0, 5.0, 0.0, -1.0, 2.0, 3.0, 3.5, 1.0, 2.0, 2.0, 2.5, 2.5,
            ],
        );
        for mode in ["avg", "max", "onnx_max"] {
            let a = attrs([2, 3], 1.0, 0, false, mode);
            let nchw = run(&t64(&[n, c, h, w], x.clone()), &rois, &a);
            let mut b = a.clone();
            b.layout = "NHWC".into();
            let nhwc = run(&t64(&[n, h, w, c], xl.clone()), &rois, &b);
            let (r, bins) = (3, 6);
            for i in 0..r {
                for ch in 0..c {
                    for k in 0..bins {
                        assert_eq!(
                            nchw[(i * c + ch) * bins + k],
                            nhwc[(i * bins + k) * c + ch],
                            "{mode}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn an_empty_box_with_adaptive_sampling_is_zero() {
        let x = t64(&[1, 1, 3, 3], vec![5.0; 9]);
        let r = t64(&[1, 5], vec![0.0, 1.0, 1.0, 1.0, 1.0]);
        for mode in ["avg", "max", "onnx_max"] {
            assert_eq!(run(&x, &r, &attrs([2, 2], 1.0, 0, true, mode)), [0.0; 4]);
            // Without `aligned` the box is one pixel: each bin's point reads 5, from corners
            // weighing 0.75² at most (ONNX's max keeps that largest weighted term).
            let want = if mode == "onnx_max" {
                5.0 * 0.5625
            } else {
                5.0
            };
            assert_eq!(run(&x, &r, &attrs([2, 2], 1.0, 0, false, mode)), [want; 4]);
        }
    }

    #[test]
    fn bad_boxes_are_errors_naming_the_box() {
        let x = t64(&[2, 1, 3, 3], vec![1.0; 18]);
        let a = attrs([2, 2], 1.0, 0, false, "avg");
        for b in [2.0, -1.0, f64::NAN, f64::INFINITY] {
            let r = t64(
                &[2, 5],
                vec![0.0, 0.0, 0.0, 1.0, 1.0, b, 0.0, 0.0, 1.0, 1.0],
            );
            let e = roi_align(&x, &r, &a).err().unwrap_or_default();
            assert!(e.contains("roi 1: batch index"), "{b}: {e}");
        }
        // A box of 1e12 pixels would sample 2.5e23 points: refused at once.
        let r = t64(&[1, 5], vec![0.0, 0.0, 0.0, 1e12, 1e12]);
        let e = roi_align(&x, &r, &a).err().unwrap_or_default();
        assert!(
            e.contains("roi 0: sampling") && e.contains("exceeds"),
            "{e}"
        );
        let bad = t64(&[2, 4], vec![0.0; 8]);
        assert!(roi_align(&x, &bad, &a).is_err_and(|e| e.contains("(num_roi, 5)")));
        let empty = t64(&[1, 1, 0, 3], vec![]);
        let r = t64(&[1, 5], vec![0.0; 5]);
        assert!(roi_align(&empty, &r, &a).is_err_and(|e| e.contains("empty")));
        // No boxes: an empty result.
        let none = t64(&[0, 5], vec![]);
        let y = roi_align(&x, &none, &a).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(y.shape(), &[0, 1, 2, 2]);
    }
}
