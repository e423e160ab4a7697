//! `conv2d` in any permutation of `NCHW` (data, output) and `OIHW` (kernel), with strides,
//! padding (top, left, bottom, right), dilation and groups.
//!
//! The data and kernel are brought to `NCHW`/`OIHW`, each (image, group) is lowered with
//! im2col to a `(C/g · KH · KW) × (OH · OW)` matrix and multiplied by the group's
//! `(O/g) × (C/g · KH · KW)` weights with matrixmultiply's sgemm (see `matmul.rs`), and the
//! result is brought to `out_layout`. Float dtypes compute in `f32` (`float64` too) and round
//! once to `out_dtype` (default: the data's dtype); integer inputs are an error.
//!
//! ```text
//! y: R.Tensor((1, 8, 16, 16), dtype="float32") = R.nn.conv2d(x, w, strides=[1, 1],
//!     padding=[1, 1, 1, 1], dilation=[1, 1], groups=1, data_layout="NCHW",
//!     kernel_layout="OIHW", out_layout="NCHW", out_dtype=None)
//! ```

use crate::matmul::gemm_f32;
use crate::nn::layout4;
use crate::util::{KResult, from_canonical, tensor, to_canonical};
use fusebox_core::op::Conv2dAttrs;
use fusebox_core::runtime::{Storage, Tensor};

fn pos(v: i64, what: &str) -> KResult<usize> {
    usize::try_from(v).map_err(|_| format!("invalid {what} {v}"))
}

/// `conv2d(x, w)`.
pub(crate) fn conv2d(x: &Tensor, w: &Tensor, a: &Conv2dAttrs) -> KResult<Tensor> {
    if x.rank() != 4 || w.rank() != 4 {
        return Err(format!(
            "expected 4-D data and weight, found {:?} and {:?}",
            x.shape(),
            w.shape()
        ));
    }
    for (t, what) in [(x, "data"), (w, "weight")] {
        if !t.dtype().is_float() {
            return Err(format!(
                "expected {what} to have a float dtype, found {}",
                t.dtype()
            ));
        }
    }
    if a.out_dtype.is_none() && x.dtype() != w.dtype() {
        return Err(format!(
            "expected data and weight of the same dtype, found {} and {}",
            x.dtype(),
            w.dtype()
        ));
    }
    let out_dtype = a.out_dtype.unwrap_or(x.dtype());
    let xc = to_canonical(x, layout4(&a.data_layout, "NCHW")?);
    let wc = to_canonical(w, layout4(&a.kernel_layout, "OIHW")?);
    let op = layout4(&a.out_layout, "NCHW")?;
    let (n, c, h, wd) = (xc.shape()[0], xc.shape()[1], xc.shape()[2], xc.shape()[3]);
    let (o, ci, kh, kw) = (wc.shape()[0], wc.shape()[1], wc.shape()[2], wc.shape()[3]);
    let g = pos(a.groups, "groups")?;
    if g == 0 || ci * g != c || o % g != 0 {
        return Err(format!(
            "data has {c} channels and the weight {:?} with groups={g}: expected C = I * groups \
             and O divisible by groups",
            wc.shape()
        ));
    }
    let [sh, sw] = [pos(a.strides[0], "stride")?, pos(a.strides[1], "stride")?];
    let [dh, dw] = [
        pos(a.dilation[0], "dilation")?,
        pos(a.dilation[1], "dilation")?,
    ];
    let [pt, pl, pb, pr] = [
        pos(a.padding[0], "padding")?,
        pos(a.padding[1], "padding")?,
        pos(a.padding[2], "padding")?,
        pos(a.padding[3], "padding")?,
    ];
    if sh == 0 || sw == 0 || dh == 0 || dw == 0 {
        return Err("strides and dilation must be at least 1".to_string());
    }
    let ekh = kh.saturating_sub(1) * dh + 1;
    let ekw = kw.saturating_sub(1) * dw + 1;
    let (ph, pw) = (h + pt + pb, wd + pl + pr);
    if kh == 0 || kw == 0 || ph < ekh || pw < ekw {
        return Err(format!(
            "the kernel ({kh}x{kw}, dilated {ekh}x{ekw}) does not fit the padded input \
             ({ph}x{pw})"
        ));
    }
    let (oh, ow) = ((ph - ekh) / sh + 1, (pw - ekw) / sw + 1);
    let xs = xc.to_f32_vec();
    let ws = wc.to_f32_vec();
    let og = o / g;
    let kdim = ci * kh * kw;
    let npix = oh * ow;
    let mut out = vec![0.0f32; n * o * npix];
    let mut col = vec![0.0f32; kdim * npix];
    for img in 0..n {
        for grp in 0..g {
            // im2col: row (ch, ky, kx), column (oy, ox).
            for ch in 0..ci {
                let plane = &xs[((img * c) + grp * ci + ch) * h * wd..][..h * wd];
                for ky in 0..kh {
                    for kx in 0..kw {
                        let row = &mut col[((ch * kh + ky) * kw + kx) * npix..][..npix];
                        for oy in 0..oh {
                            let y = (oy * sh + ky * dh) as isize - pt as isize;
                            let dst = &mut row[oy * ow..(oy + 1) * ow];
                            if y < 0 || y >= h as isize {
                                dst.iter_mut().for_each(|v| *v = 0.0);
                                continue;
                            }
                            let src = &plane[y as usize * wd..][..wd];
                            for (ox, d) in dst.iter_mut().enumerate() {
                                let xx = (ox * sw + kx * dw) as isize - pl as isize;
                                *d = if xx < 0 || xx >= wd as isize {
                                    0.0
                                } else {
                                    src[xx as usize]
                                };
                            }
                        }
                    }
                }
            }
            let wg = &ws[grp * og * kdim..(grp + 1) * og * kdim];
            let dst = &mut out[(img * o + grp * og) * npix..][..og * npix];
            gemm_f32(og, kdim, npix, wg, &col, dst)?;
        }
    }
    let t = tensor(vec![n, o, oh, ow], Storage::from_f32(out_dtype, out))?;
    Ok(from_canonical(&t, op))
}
