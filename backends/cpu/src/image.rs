//! `relax.image.resize2d`: nearest / linear / cubic resampling of the two spatial axes, in any
//! permutation of `NCHW`, with TVM topi's coordinate transformations and rounding rules.
//!
//! Contract: each output axis gets a table of (input index, weight) taps computed once
//! ([`Resize2dAttrs::taps`], shared with the CUDA lowering); an output point is the separable sum over the two tables. Nearest copies
//! elements exactly for every dtype; linear and cubic compute in `f64` and round once to the
//! output dtype. Points that `tf_crop_and_resize` maps outside the input take
//! `extrapolation_value`. Sizes are checked, never trusted.
//!
//! ```text
//! y: R.Tensor((1, 1, 4, 4), dtype="float32") = R.image.resize2d(x, R.shape([4, 4]),
//!     method="linear", coordinate_transformation_mode="half_pixel")
//! ```

use crate::util::{KResult, from_canonical, from_f64, map_same, numel, tensor, to_canonical};
use crate::nn::layout4;
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
        return Err(format!(
            "expected a 4-D input, found shape {:?}",
            x.shape()
        ));
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
    let all_single = th.iter().chain(tw.iter()).all(|t| matches!(t, Some(v) if v.len() == 1));
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
        from_f64(out_shape, x.dtype(), out)?
    };
    let y = if out_dtype == y.dtype() {
        y
    } else {
        crate::elementwise::astype(&y, out_dtype)
    };
    Ok(from_canonical(&y, pos))
}
