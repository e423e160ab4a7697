//! Type inference of `relax.nn.conv2d` and the 2-D pools in any layout of their alphabets,
//! split ones included (`NCHW16c`, `OIHW16i16o`: [`crate::op::layout`]): the operands' logical
//! extents are read through their layouts, the result's computed in `NCHW` order and laid out
//! in `out_layout`.
//!
//! ```text
//! x: (1, 4, 14, 14, 16), w: (128, 64, 1, 1)
//! R.nn.conv2d(x, w, data_layout="NCHW16c", kernel_layout="OIHW", out_layout="NCHW16c")
//!     -> (1, 8, 14, 14, 16)
//! x: (1, 4, 14, 14, 16)        R.nn.max_pool2d(x, pool_size=[3, 3], strides=[2, 2],
//!                                  padding=[1, 1, 1, 1], layout="NCHW16c") -> (1, 4, 7, 7, 16)
//! ```

use super::super::layout::Layout;
use super::super::{AdaptivePool2dAttrs, Conv2dAttrs, Pool2dAttrs};
use super::{Cx, common_dtype, known, shape_str, unknown, window_out};
use crate::ir::{Dim, TensorType, Type};

/// Parses `layout` (the attribute `what`) over `alphabet`.
fn layout(cx: &Cx<'_>, what: &str, layout: &str, alphabet: &str) -> Result<Layout, String> {
    Layout::parse(layout, alphabet).ok_or_else(|| {
        cx.err(format!(
            "invalid {what} \"{layout}\": expected a permutation of {alphabet}, each axis \
             possibly split by a sub-axis such as 16{}",
            alphabet.as_bytes()[1].to_ascii_lowercase() as char
        ))
    })
}

/// The logical extents of operand `t` (`what`) held in `l`, in `alphabet`'s order; `None` when
/// its shape is unknown.
fn logical(
    cx: &Cx<'_>,
    t: &TensorType,
    l: &Layout,
    alphabet: &str,
    what: &str,
) -> Result<Option<[Dim; 4]>, String> {
    cx.rank(t, l.rank(), what)?;
    let Some(d) = &t.dims else {
        return Ok(None);
    };
    let v = l
        .logical(d, alphabet)
        .map_err(|e| cx.err(format!("{what}: {e}")))?;
    Ok(v.try_into().ok())
}

/// `relax.nn.conv2d(data, weight)`.
pub(super) fn conv2d(cx: &Cx<'_>, a: &Conv2dAttrs) -> Result<Type, String> {
    let (x, w) = (cx.tensor(0, "data")?, cx.tensor(1, "weight")?);
    let dl = layout(cx, "data_layout", &a.data_layout, "NCHW")?;
    let kl = layout(cx, "kernel_layout", &a.kernel_layout, "OIHW")?;
    let ol = layout(cx, "out_layout", &a.out_layout, "NCHW")?;
    let dtype = match a.out_dtype {
        Some(d) => Some(d),
        None => common_dtype(cx, x.dtype, w.dtype)?,
    };
    let (xd, wd) = (
        logical(cx, x, &dl, "NCHW", "data")?,
        logical(cx, w, &kl, "OIHW", "weight")?,
    );
    let (Some([n, c, h, wi]), Some([o, i, kh, kw])) = (xd, wd) else {
        return Ok(unknown(Some(ol.rank()), dtype));
    };
    if let (Some(c), Some(i)) = (c.as_static(), i.as_static())
        && i.checked_mul(a.groups) != Some(c)
    {
        return Err(cx.err(format!(
            "data has {c} input channels but the weight expects {i} per group x {} groups = {}",
            a.groups,
            i.saturating_mul(a.groups)
        )));
    }
    if let Some(o) = o.as_static()
        && a.groups != 0
        && o.checked_rem(a.groups) != Some(0)
    {
        return Err(cx.err(format!(
            "the weight's {o} output channels are not divisible by groups={}",
            a.groups
        )));
    }
    let win = |d: &Dim, k: &Dim, ax: usize| {
        window_out(
            d,
            k,
            a.strides[ax],
            (a.padding[ax], a.padding[ax + 2]),
            a.dilation[ax],
            false,
        )
        .map_err(|e| cx.err(e))
    };
    let (oh, ow) = (win(&h, &kh, 0)?, win(&wi, &kw, 1)?);
    let out = ol
        .physical(&[n, o, oh, ow], "NCHW")
        .map_err(|e| cx.err(format!("out_layout: {e}")))?;
    Ok(known(out, dtype))
}

/// `relax.nn.max_pool2d` / `relax.nn.avg_pool2d`.
pub(super) fn pool2d(cx: &Cx<'_>, a: &Pool2dAttrs) -> Result<Type, String> {
    let x = cx.tensor(0, "data")?;
    let l = layout(cx, "layout", &a.layout, "NCHW")?;
    let ol = layout(cx, "out_layout", &a.out_layout, "NCHW")?;
    let Some([n, c, h, w]) = logical(cx, x, &l, "NCHW", "data")? else {
        return Ok(unknown(Some(ol.rank()), x.dtype));
    };
    let win = |d: &Dim, ax: usize| {
        window_out(
            d,
            &Dim::Static(a.pool_size[ax]),
            a.strides[ax],
            (a.padding[ax], a.padding[ax + 2]),
            a.dilation[ax],
            a.ceil_mode,
        )
        .map_err(|e| cx.err(e))
    };
    let (oh, ow) = (win(&h, 0)?, win(&w, 1)?);
    for d in [&oh, &ow] {
        if let Some(v) = d.as_static()
            && v <= 0
        {
            let xd = x.dims.as_deref().unwrap_or(&[]);
            return Err(cx.err(format!(
                "the pooling window does not fit: output extent {v} for input {}",
                shape_str(xd)
            )));
        }
    }
    let out = ol
        .physical(&[n, c, oh, ow], "NCHW")
        .map_err(|e| cx.err(format!("out_layout: {e}")))?;
    Ok(known(out, x.dtype))
}

/// `relax.nn.adaptive_avg_pool2d`.
pub(super) fn adaptive_pool2d(cx: &Cx<'_>, a: &AdaptivePool2dAttrs) -> Result<Type, String> {
    let x = cx.tensor(0, "data")?;
    let l = layout(cx, "layout", &a.layout, "NCHW")?;
    let ol = layout(cx, "out_layout", &a.out_layout, "NCHW")?;
    let Some([n, c, h, w]) = logical(cx, x, &l, "NCHW", "data")? else {
        return Ok(unknown(Some(ol.rank()), x.dtype));
    };
    let (oh, ow) = match a.output_size {
        Some([oh, ow]) => (Dim::Static(oh), Dim::Static(ow)),
        None => (h, w),
    };
    let out = ol
        .physical(&[n, c, oh, ow], "NCHW")
        .map_err(|e| cx.err(format!("out_layout: {e}")))?;
    Ok(known(out, x.dtype))
}
