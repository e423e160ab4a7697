//! `relax.nn.conv2d_transpose`: the gradient of conv2d with respect to its input, as a direct
//! scatter (every input element adds its kernel-weighted footprint to the output), in any
//! permutation of `NCHW` / `IOHW`.
//!
//! Contract: float dtypes only (ONNX's ConvTranspose takes no others); computes in `f64` and
//! rounds once to the output dtype. Output extent per axis:
//! `(in - 1) * stride - pad_begin - pad_end + (k - 1) * dilation + output_padding + 1`,
//! checked (an extent below 1 or an overflowing size is an error, never a panic).
//!
//! ```text
//! y: R.Tensor((1, 2, 5, 5), dtype="float32") = R.nn.conv2d_transpose(x, w, strides=[1, 1],
//!     padding=[0, 0, 0, 0], output_padding=[0, 0], dilation=[1, 1], groups=1,
//!     data_layout="NCHW", kernel_layout="IOHW", out_layout="NCHW", out_dtype=None)
//! ```

use crate::nn::layout4;
use crate::util::{KResult, floats, from_canonical, from_f64, numel, to_canonical};
use fusebox_core::op::Conv2dTransposeAttrs;
use fusebox_core::runtime::Tensor;

fn out_extent(i: usize, k: usize, s: i64, p0: i64, p1: i64, d: i64, op: i64) -> KResult<usize> {
    let ext = (|| {
        let i = i64::try_from(i).ok()?;
        let k = i64::try_from(k).ok()?;
        let full = (i - 1)
            .checked_mul(s)?
            .checked_add((k - 1).checked_mul(d)?)?
            .checked_add(1)?
            .checked_add(op)?;
        full.checked_sub(p0)?.checked_sub(p1)
    })()
    .ok_or_else(|| "the output size overflows".to_string())?;
    usize::try_from(ext)
        .ok()
        .filter(|&e| e >= 1)
        .ok_or_else(|| format!("the padding leaves an output extent of {ext} (expected ≥ 1)"))
}

/// The taps `t` in `0..k` with `base + t·d` inside `0..o` (`d ≥ 1`): a range, since the
/// positions increase with `t`.
fn taps(base: isize, d: isize, k: usize, o: usize) -> std::ops::Range<usize> {
    let o = o as isize;
    // The first tap at or past 0, and the first at or past `o`.
    let first_at = |target: isize| -> usize {
        if base >= target {
            0
        } else {
            usize::try_from((target - base + d - 1) / d).unwrap_or(usize::MAX)
        }
    };
    let lo = first_at(0).min(k);
    let hi = first_at(o).min(k);
    lo..hi.max(lo)
}

/// `conv2d_transpose(x, w)`.
pub(crate) fn conv2d_transpose(
    x: &Tensor,
    w: &Tensor,
    a: &Conv2dTransposeAttrs,
) -> KResult<Tensor> {
    if x.rank() != 4 || w.rank() != 4 {
        return Err(format!(
            "expected 4-D data and weight, found shapes {:?} and {:?}",
            x.shape(),
            w.shape()
        ));
    }
    let dp = layout4(&a.data_layout, "NCHW")?;
    let kp = layout4(&a.kernel_layout, "IOHW")?;
    let op_ = layout4(&a.out_layout, "NCHW")?;
    let xc = to_canonical(x, dp);
    let wc = to_canonical(w, kp);
    let &[n, c, ih, iw] = xc.shape() else {
        return Err("internal: canonical data is not 4-D".to_string());
    };
    let &[wi, ocg, kh, kw] = wc.shape() else {
        return Err("internal: canonical weight is not 4-D".to_string());
    };
    let groups = usize::try_from(a.groups)
        .ok()
        .filter(|&g| g >= 1)
        .ok_or_else(|| format!("invalid groups {}", a.groups))?;
    if wi != c || c % groups != 0 {
        return Err(format!(
            "data has {c} input channels; the weight (IOHW) has {wi}, and groups={groups} must \
             divide them"
        ));
    }
    if ih == 0 || iw == 0 || kh == 0 || kw == 0 {
        return Err("empty spatial extents are not supported".to_string());
    }
    let [sh, sw] = a.strides;
    let [dh, dw] = a.dilation;
    let [pt, pl, pb, pr] = a.padding;
    let oh = out_extent(ih, kh, sh, pt, pb, dh, a.output_padding[0])?;
    let ow = out_extent(iw, kw, sw, pl, pr, dw, a.output_padding[1])?;
    let oc = ocg
        .checked_mul(groups)
        .ok_or_else(|| "the output channel count overflows".to_string())?;
    let out_shape = vec![n, oc, oh, ow];
    let total = numel(&out_shape)?;
    let xs = floats(&xc, "data")?;
    let ws = floats(&wc, "weight")?;
    let mut out = vec![0.0; total];
    let icg = c / groups;
    if dh < 1 || dw < 1 || sh < 1 || sw < 1 {
        return Err(format!(
            "strides {:?} and dilation {:?} must be at least 1",
            a.strides, a.dilation
        ));
    }
    // Signed coordinates; the extents were checked above, so these fit.
    let (sh, sw, dh, dw) = (sh as isize, sw as isize, dh as isize, dw as isize);
    let (pt, pl) = (pt as isize, pl as isize);
    // Only the taps that land inside the output are visited (a kernel far taller than the
    // output, cropped by its padding, costs what the output does, not what the kernel does).
    let rows: Vec<std::ops::Range<usize>> = (0..ih)
        .map(|y| taps(y as isize * sh - pt, dh, kh, oh))
        .collect();
    let cols: Vec<std::ops::Range<usize>> = (0..iw)
        .map(|x| taps(x as isize * sw - pl, dw, kw, ow))
        .collect();
    for b in 0..n {
        for ci in 0..c {
            let g = ci / icg;
            for y in 0..ih {
                for xq in 0..iw {
                    let v = xs[((b * c + ci) * ih + y) * iw + xq];
                    for o in 0..ocg {
                        let co = g * ocg + o;
                        let wbase = (ci * ocg + o) * kh * kw;
                        let obase = (b * oc + co) * oh * ow;
                        for ky in rows[y].clone() {
                            let oy = y as isize * sh - pt + ky as isize * dh;
                            for kx in cols[xq].clone() {
                                let ox = xq as isize * sw - pl + kx as isize * dw;
                                out[obase + oy as usize * ow + ox as usize] +=
                                    v * ws[wbase + ky * kw + kx];
                            }
                        }
                    }
                }
            }
        }
    }
    let dtype = a.out_dtype.unwrap_or(x.dtype());
    let y = from_f64(out_shape, dtype, out)?;
    Ok(from_canonical(&y, op_))
}

#[cfg(test)]
mod tests {
    use super::*;
    use fusebox_core::ir::DType;
    use fusebox_core::runtime::Storage;

    fn attrs(s: i64, p: [i64; 4], op: [i64; 2], d: i64, g: i64) -> Conv2dTransposeAttrs {
        Conv2dTransposeAttrs {
            strides: [s, s],
            padding: p,
            output_padding: op,
            dilation: [d, d],
            groups: g,
            data_layout: "NCHW".into(),
            kernel_layout: "IOHW".into(),
            out_layout: "NCHW".into(),
            out_dtype: None,
        }
    }

    fn t64(shape: &[usize], v: Vec<f64>) -> Tensor {
        Tensor::new(shape.to_vec(), Storage::F64(v)).unwrap_or_else(|e| panic!("{e}"))
    }

    /// The definition as a gather: output (oy, ox) takes input (iy, ix) through tap (ky, kx)
    /// when `oy = iy·s - pad + ky·d`.
    #[allow(clippy::too_many_arguments, reason = "test reference")]
    fn reference(
        x: &[f64],
        xs: [usize; 4],
        w: &[f64],
        ws: [usize; 4],
        a: &Conv2dTransposeAttrs,
        out: [usize; 4],
    ) -> Vec<f64> {
        let [n, c, ih, iw] = xs;
        let [_, ocg, kh, kw] = ws;
        let g = a.groups as usize;
        let icg = c / g;
        let mut y = vec![0.0; out.iter().product()];
        for b in 0..n {
            for co in 0..out[1] {
                let grp = co / ocg;
                for oy in 0..out[2] {
                    for ox in 0..out[3] {
                        let mut acc = 0.0;
                        for ci in grp * icg..(grp + 1) * icg {
                            for ky in 0..kh {
                                for kx in 0..kw {
                                    let ty = oy as i64 + a.padding[0] - (ky as i64) * a.dilation[0];
                                    let tx = ox as i64 + a.padding[1] - (kx as i64) * a.dilation[1];
                                    if ty < 0
                                        || tx < 0
                                        || ty % a.strides[0] != 0
                                        || tx % a.strides[1] != 0
                                    {
                                        continue;
                                    }
                                    let (iy, ix) = (
                                        (ty / a.strides[0]) as usize,
                                        (tx / a.strides[1]) as usize,
                                    );
                                    if iy >= ih || ix >= iw {
                                        continue;
                                    }
                                    acc += x[((b * c + ci) * ih + iy) * iw + ix]
                                        * w[((ci * ocg + co % ocg) * kh + ky) * kw + kx];
                                }
                            }
                        }
                        y[((b * out[1] + co) * out[2] + oy) * out[3] + ox] = acc;
                    }
                }
            }
        }
        y
    }

    #[test]
    fn hand_computed_stride_1() {
        // [[1, 2], [3, 4]] spread by a 2×2 kernel of ones.
        let x = t64(&[1, 1, 2, 2], vec![1.0, 2.0, 3.0, 4.0]);
        let w = t64(&[1, 1, 2, 2], vec![1.0; 4]);
        let y = conv2d_transpose(&x, &w, &attrs(1, [0; 4], [0, 0], 1, 1))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(y.shape(), &[1, 1, 3, 3]);
        assert_eq!(
            y.to_f64_vec(),
            vec![1.0, 3.0, 2.0, 4.0, 10.0, 6.0, 3.0, 7.0, 4.0]
        );
    }

    #[test]
    fn matches_the_gather_definition() {
        let xs = [2usize, 4, 3, 4];
        let xv: Vec<f64> = (0..96).map(|i| ((i * 7) % 11) as f64 - 5.0).collect();
        for (s, p, op, d, g, ocg) in [
            (1, [0, 0, 0, 0], [0, 0], 1, 1, 3),
            (2, [1, 0, 0, 1], [1, 0], 1, 2, 2),
            (3, [1, 1, 1, 1], [2, 1], 2, 1, 1),
            (2, [0, 2, 1, 0], [0, 1], 2, 4, 2),
        ] {
            let ws = [4usize, ocg, 3, 2];
            let wv: Vec<f64> = (0..ws.iter().product::<usize>())
                .map(|i| ((i * 5) % 7) as f64 * 0.5 - 1.0)
                .collect();
            let a = attrs(s, p, op, d, g);
            let x = t64(&xs, xv.clone());
            let w = t64(&ws, wv.clone());
            let y = conv2d_transpose(&x, &w, &a).unwrap_or_else(|e| panic!("{e}"));
            let out = [
                2,
                ocg * g as usize,
                ((3 - 1) * s - p[0] - p[2] + (3 - 1) * d + op[0] + 1) as usize,
                ((4 - 1) * s - p[1] - p[3] + d + op[1] + 1) as usize, // kernel width 2
            ];
            assert_eq!(y.shape(), &out);
            let want = reference(&xv, xs, &wv, ws, &a, out);
            assert_eq!(y.to_f64_vec(), want, "s {s} p {p:?} op {op:?} d {d} g {g}");
        }
    }

    #[test]
    fn a_kernel_taller_than_its_cropped_output_visits_only_the_taps_inside() {
        // Kernel 9 × 5 against an input of 3 × 4 whose padding crops most of each footprint
        // (a fuzzed ConvTranspose had a kernel 100,000 tall with an output of 86 rows: every
        // tap was visited and bounds-checked, 34 s). Same values as the gather definition.
        let xs = [1usize, 2, 3, 4];
        let xv: Vec<f64> = (0..24).map(|i| ((i * 5) % 9) as f64 - 4.0).collect();
        for (s, p, d) in [
            (2, [5, 2, 6, 3], 1),
            (1, [4, 0, 3, 4], 1),
            (3, [4, 1, 9, 1], 2),
            (1, [0, 0, 0, 0], 1),
        ] {
            let ws = [2usize, 2, 9, 5];
            let wv: Vec<f64> = (0..ws.iter().product::<usize>())
                .map(|i| ((i * 3) % 7) as f64 * 0.25 - 0.5)
                .collect();
            let a = attrs(s, p, [0, 0], d, 1);
            let y = conv2d_transpose(&t64(&xs, xv.clone()), &t64(&ws, wv.clone()), &a)
                .unwrap_or_else(|e| panic!("{e}"));
            let out = [
                1,
                2,
                ((3 - 1) * s - p[0] - p[2] + 8 * d + 1) as usize,
                ((4 - 1) * s - p[1] - p[3] + 4 * d + 1) as usize,
            ];
            assert_eq!(y.shape(), &out);
            let want = reference(&xv, xs, &wv, ws, &a, out);
            assert_eq!(y.to_f64_vec(), want, "s {s} p {p:?} d {d}");
        }
        let zero = attrs(0, [0; 4], [0, 0], 1, 1);
        let x = t64(&[1, 1, 2, 2], vec![1.0; 4]);
        let w = t64(&[1, 1, 2, 2], vec![1.0; 4]);
        assert!(conv2d_transpose(&x, &w, &zero).is_err_and(|e| e.contains("at least 1")));
    }

    #[test]
    fn every_float_dtype_and_errors() {
        for dt in [DType::F16, DType::BF16, DType::F32, DType::F64] {
            let x = t64(&[1, 1, 2, 2], vec![1.0, 2.0, 3.0, 4.0]).cast(dt);
            let w = t64(&[1, 1, 2, 2], vec![1.0; 4]).cast(dt);
            let y = conv2d_transpose(&x, &w, &attrs(1, [0; 4], [0, 0], 1, 1))
                .unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(y.dtype(), dt);
            assert_eq!(y.to_f64_vec()[4], 10.0);
        }
        let x = t64(&[1, 1, 2, 2], vec![1.0; 4]);
        let xi = x.cast(DType::I32);
        let w = t64(&[1, 1, 2, 2], vec![1.0; 4]);
        let a = attrs(1, [0; 4], [0, 0], 1, 1);
        assert!(conv2d_transpose(&xi, &w.cast(DType::I32), &a).is_err_and(|e| e.contains("float")));
        let w2 = t64(&[2, 1, 2, 2], vec![1.0; 8]);
        assert!(conv2d_transpose(&x, &w2, &a).is_err_and(|e| e.contains("input channels")));
        let big = attrs(1, [3, 3, 3, 3], [0, 0], 1, 1);
        assert!(conv2d_transpose(&x, &w, &big).is_err_and(|e| e.contains("extent")));
        let huge = attrs(i64::MAX, [0; 4], [0, 0], 1, 1);
        assert!(conv2d_transpose(&x, &w, &huge).is_err_and(|e| e.contains("overflow")));
        let x3 = t64(&[1, 2, 2], vec![1.0; 4]);
        assert!(conv2d_transpose(&x3, &w, &a).is_err_and(|e| e.contains("4-D")));
    }
}
