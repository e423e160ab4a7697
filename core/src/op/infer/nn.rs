//! Type inference of the `nn` family ops added for issue 17 (`relax.nn.conv2d_transpose`,
//! `relax.image.resize2d`) and of the sampling ops (`relax.image.grid_sample`,
//! `relax.image.affine_grid`, whose grids are channel-first as in TVM) and
//! `relax.vision.roi_align`.
//!
//! Contract: as [`super::infer`]: symbolic dims flow through, unknown shapes give a less specific
//! type, and errors say what was expected and what was found.
//!
//! ```text
//! x: (n, 4, 5, 5), w: (4, 2, 3, 3)   R.nn.conv2d_transpose(x, w, strides=[2, 2])  -> (n, 2, 11, 11)
//! x: (1, 3, h, w)                    R.image.resize2d(x, R.shape([8, 8]))           -> (1, 3, 8, 8)
//! t: (n, 2, 3)                       R.image.affine_grid(t, R.shape([4, 5]))        -> (n, 2, 4, 5)
//! x: (n, 3, 8, 8), g: (n, 2, 4, 5)   R.image.grid_sample(x, g)                      -> (n, 3, 4, 5)
//! x: (n, 3, 8, 8), r: (k, 5)         R.vision.roi_align(x, r, pooled_size=[2, 2], ...) -> (k, 3, 2, 2)
//! ```

use super::super::attrs::layout_pos;
use super::super::{
    Conv2dTransposeAttrs, GridSampleAttrs, GroupNormAttrs, Resize2dAttrs, RoiAlignAttrs,
};
use super::{Cx, common_dtype, differ, known, permute_out, same, unknown};
use crate::ir::{Dim, Type};

/// Output extent of a transposed convolution:
/// `(i - 1) * s - pad + (k - 1) * d + output_padding + 1`.
fn transpose_out(i: &Dim, k: &Dim, s: i64, pad: i64, d: i64, out_pad: i64) -> Dim {
    let eff = k
        .sub(&Dim::Static(1))
        .mul(&Dim::Static(d))
        .add(&Dim::Static(1));
    i.sub(&Dim::Static(1))
        .mul(&Dim::Static(s))
        .sub(&Dim::Static(pad))
        .add(&eff)
        .add(&Dim::Static(out_pad))
}

/// `relax.nn.conv2d_transpose(data, weight)`: weight in `IOHW` (input channels, output
/// channels per group, kernel h, kernel w).
pub(super) fn conv2d_transpose(cx: &Cx<'_>, a: &Conv2dTransposeAttrs) -> Result<Type, String> {
    let (x, w) = (cx.tensor(0, "data")?, cx.tensor(1, "weight")?);
    cx.rank(x, 4, "data")?;
    cx.rank(w, 4, "weight")?;
    let dtype = match a.out_dtype {
        Some(d) => Some(d),
        None => common_dtype(cx, x.dtype, w.dtype)?,
    };
    let bad = |k: &str, l: &str| cx.err(format!("invalid {k} \"{l}\""));
    let dp = layout_pos::<4>(&a.data_layout, "NCHW")
        .ok_or_else(|| bad("data_layout", &a.data_layout))?;
    let kp = layout_pos::<4>(&a.kernel_layout, "IOHW")
        .ok_or_else(|| bad("kernel_layout", &a.kernel_layout))?;
    let op_ =
        layout_pos::<4>(&a.out_layout, "NCHW").ok_or_else(|| bad("out_layout", &a.out_layout))?;
    let (Some(xd), Some(wd)) = (&x.dims, &w.dims) else {
        return Ok(unknown(Some(4), dtype));
    };
    let at = |d: &[Dim], p: usize| d.get(p).cloned().unwrap_or(Dim::Static(0));
    let (n, c, h, wi) = (at(xd, dp[0]), at(xd, dp[1]), at(xd, dp[2]), at(xd, dp[3]));
    let (i, o, kh, kw) = (at(wd, kp[0]), at(wd, kp[1]), at(wd, kp[2]), at(wd, kp[3]));
    if let (Some(c), Some(i)) = (c.as_static(), i.as_static())
        && c != i
    {
        return Err(cx.err(format!(
            "data has {c} input channels but the weight (IOHW) has {i}"
        )));
    }
    if let Some(c) = c.as_static()
        && c.checked_rem(a.groups) != Some(0)
    {
        return Err(cx.err(format!(
            "the {c} input channels are not divisible by groups={}",
            a.groups
        )));
    }
    let oc = o.mul(&Dim::Static(a.groups));
    let oh = transpose_out(
        &h,
        &kh,
        a.strides[0],
        a.padding[0].saturating_add(a.padding[2]),
        a.dilation[0],
        a.output_padding[0],
    );
    let ow = transpose_out(
        &wi,
        &kw,
        a.strides[1],
        a.padding[1].saturating_add(a.padding[3]),
        a.dilation[1],
        a.output_padding[1],
    );
    Ok(known(permute_out(&op_, [n, oc, oh, ow]), dtype))
}

/// `relax.image.resize2d(data, size)`: the spatial dims become `size`.
pub(super) fn resize2d(cx: &Cx<'_>, a: &Resize2dAttrs) -> Result<Type, String> {
    let x = cx.tensor(0, "data")?;
    cx.rank(x, 4, "data")?;
    let dtype = a.out_dtype.or(x.dtype);
    let lp = layout_pos::<4>(&a.layout, "NCHW")
        .ok_or_else(|| cx.err(format!("invalid layout \"{}\"", a.layout)))?;
    let (size, rank) = cx.shape(1)?;
    if let Some(r) = rank
        && r != 2
    {
        return Err(cx.err(format!(
            "expected the size to have 2 values (height, width), found {r}"
        )));
    }
    let (Some(xd), Some(size)) = (&x.dims, size) else {
        return Ok(unknown(Some(4), dtype));
    };
    if let Some(d) = size.iter().find(|d| d.as_static().is_some_and(|v| v < 1)) {
        return Err(cx.err(format!("expected output sizes ≥ 1, found {d}")));
    }
    let at = |p: usize| xd.get(p).cloned().unwrap_or(Dim::Static(0));
    let (oh, ow) = (size[0].clone(), size[1].clone());
    Ok(known(
        permute_out(&lp, [at(lp[0]), at(lp[1]), oh, ow]),
        dtype,
    ))
}

/// `relax.nn.group_norm` / `relax.nn.instance_norm(data, gamma, beta)`: the data's type;
/// gamma and beta are per channel, the channel count divisible by `num_groups`.
pub(super) fn group_norm(cx: &Cx<'_>, a: &GroupNormAttrs) -> Result<Type, String> {
    let x = cx.tensor(0, "data")?;
    let g = cx.tensor(1, "gamma")?;
    let b = cx.tensor(2, "beta")?;
    common_dtype(cx, x.dtype, g.dtype)?;
    common_dtype(cx, x.dtype, b.dtype)?;
    cx.float(x, "data")?;
    let Some(r) = x.rank() else {
        return Ok(same(x));
    };
    let ch = cx.axis(a.channel_axis, r)?;
    let axes = cx.axes(&a.axes, r)?;
    if axes.contains(&ch) {
        return Err(cx.err(format!(
            "the channel axis {} is also in axes {:?}",
            a.channel_axis, a.axes
        )));
    }
    let c = x.dims.as_ref().and_then(|d| d.get(ch).cloned());
    for (p, what) in [(g, "gamma"), (b, "beta")] {
        cx.rank(p, 1, what)?;
        if let (Some(c), Some(pd)) = (&c, p.dims.as_ref().and_then(|d| d.first()))
            && differ(c, pd)
        {
            return Err(cx.err(format!(
                "expected {what} to have one value per channel ({c}), found {pd}"
            )));
        }
    }
    if a.num_groups > 0
        && let Some(cv) = c.as_ref().and_then(Dim::as_static)
        && cv % a.num_groups != 0
    {
        return Err(cx.err(format!(
            "the {cv} channels are not divisible by num_groups={}",
            a.num_groups
        )));
    }
    Ok(same(x))
}

/// `relax.image.grid_sample(data, grid)`: `data` is `(N, C, *in)` (2 or 3 spatial axes, by the
/// layout), `grid` `(N, r, *out)` with `r` the spatial rank (channel-first, as in TVM); the
/// result is `(N, C, *out)` of the data's dtype.
pub(super) fn grid_sample(cx: &Cx<'_>, a: &GridSampleAttrs) -> Result<Type, String> {
    let x = cx.tensor(0, "data")?;
    let g = cx.tensor(1, "grid")?;
    let r = a.spatial();
    cx.rank(x, r + 2, "data")?;
    cx.rank(g, r + 2, "grid")?;
    cx.float(x, "data")?;
    cx.float(g, "grid")?;
    if let Some(gd) = &g.dims {
        if let Some(c) = gd.get(1).and_then(Dim::as_static)
            && c != r as i64
        {
            return Err(cx.err(format!(
                "expected the grid's axis 1 to hold the {r} coordinates of a {} sample, found {c}",
                a.layout
            )));
        }
        if let (Some(xn), Some(gn)) = (x.dims.as_ref().and_then(|d| d.first()), gd.first())
            && differ(xn, gn)
        {
            return Err(cx.err(format!(
                "expected the grid's batch ({gn}) to be the data's ({xn})"
            )));
        }
    }
    let (Some(xd), Some(gd)) = (&x.dims, &g.dims) else {
        return Ok(unknown(Some(r + 2), x.dtype));
    };
    let mut out = vec![xd[0].clone(), xd[1].clone()];
    out.extend(gd[2..].iter().cloned());
    Ok(known(out, x.dtype))
}

/// `relax.image.affine_grid(theta, size)`: `theta` is `(N, r, r + 1)` for a `size` of `r` = 2
/// or 3 extents; the result is the channel-first grid `(N, r, *size)` of theta's dtype.
pub(super) fn affine_grid(cx: &Cx<'_>) -> Result<Type, String> {
    let t = cx.tensor(0, "theta")?;
    cx.rank(t, 3, "theta")?;
    cx.float(t, "theta")?;
    let (size, rank) = cx.shape(1)?;
    let r = match rank {
        Some(r @ (2 | 3)) => r,
        Some(r) => {
            return Err(cx.err(format!(
                "expected the size to have 2 (height, width) or 3 (depth, height, width) values, found {r}"
            )));
        }
        None => return Ok(unknown(None, t.dtype)),
    };
    if let Some(td) = &t.dims {
        let want = [r as i64, r as i64 + 1];
        for (i, w) in [1, 2].into_iter().zip(want) {
            if let Some(v) = td.get(i).and_then(Dim::as_static)
                && v != w
            {
                return Err(cx.err(format!(
                    "expected theta of shape (N, {r}, {}) for a {r}-D grid, found axis {i} = {v}",
                    r + 1
                )));
            }
        }
    }
    let (Some(td), Some(size)) = (&t.dims, size) else {
        return Ok(unknown(Some(r + 2), t.dtype));
    };
    if let Some(d) = size.iter().find(|d| d.as_static().is_some_and(|v| v < 1)) {
        return Err(cx.err(format!("expected grid sizes ≥ 1, found {d}")));
    }
    let mut out = vec![td[0].clone(), Dim::Static(r as i64)];
    out.extend(size.iter().cloned());
    Ok(known(out, t.dtype))
}

/// `relax.vision.roi_align(data, rois)`: `data` 4-D in the layout, `rois` `(R, 5)` of a float
/// dtype; the result is `(R, C, PH, PW)` (`(R, PH, PW, C)` for `NHWC`) of the data's dtype.
pub(super) fn roi_align(cx: &Cx<'_>, a: &RoiAlignAttrs) -> Result<Type, String> {
    let x = cx.tensor(0, "data")?;
    let r = cx.tensor(1, "rois")?;
    cx.rank(x, 4, "data")?;
    cx.rank(r, 2, "rois")?;
    cx.float(x, "data")?;
    cx.float(r, "rois")?;
    if let Some(c) = r.dims.as_ref().and_then(|d| d[1].as_static())
        && c != 5
    {
        return Err(cx.err(format!(
            "expected rois of shape (num_roi, 5) ([batch_index, x1, y1, x2, y2] rows), found {c} \
             columns"
        )));
    }
    let (Some(xd), Some(rd)) = (&x.dims, &r.dims) else {
        return Ok(unknown(Some(4), x.dtype));
    };
    let [ph, pw] = a.pooled_size.map(Dim::Static);
    let out = if a.layout == "NHWC" {
        vec![rd[0].clone(), ph, pw, xd[3].clone()]
    } else {
        vec![rd[0].clone(), xd[1].clone(), ph, pw]
    };
    Ok(known(out, x.dtype))
}
