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
    // Signed coordinates; the extents were checked above, so these fit.
    let (sh, sw, dh, dw) = (sh as isize, sw as isize, dh as isize, dw as isize);
    let (pt, pl) = (pt as isize, pl as isize);
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
                        for ky in 0..kh {
                            let oy = y as isize * sh - pt + ky as isize * dh;
                            if oy < 0 || oy >= oh as isize {
                                continue;
                            }
                            for kx in 0..kw {
                                let ox = xq as isize * sw - pl + kx as isize * dw;
                                if ox < 0 || ox >= ow as isize {
                                    continue;
                                }
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
