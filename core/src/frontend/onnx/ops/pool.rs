//! ONNX pooling nodes → the op set (the `nn` family's pools): `MaxPool` (with its `Indices`),
//! `AveragePool` and `LpPool` in 1-D, 2-D and 3-D, and the global pools.
//!
//! Contract: as [`super::nn`]'s converters, one [`Out`] per supported output. 2-D pools map
//! onto `relax.nn.{max,avg}_pool2d` (1-D ones lifted to 2-D and squeezed back); 3-D ones
//! become two 2-D pools over reshapes of the volume (`H × W`, then `D`). In ceil mode a last
//! window that would start in the end padding is dropped, as ONNX's reference (and PyTorch)
//! drop it. `LpPool` is the window sum of `|x|^p` (an average pool counting the padding, times
//! the window size) and its `p`th root; `LpPool` with `ceil_mode` is an error (a partial window
//! would be averaged over fewer positions).
//!
//! ```text
//! GlobalMaxPool(X)         ->  R.max(X, axis=[2, 3], keepdims=True)
//! LpPool(X; p=2, k=[2,2])  ->  lv  = R.multiply(X, X)
//!                              lv1 = R.nn.avg_pool2d(lv, pool_size=[2, 2], count_include_pad=True, ..)
//!                              lv2 = R.multiply(lv1, R.const(4.0, "float32"))
//!                              y   = R.sqrt(lv2)
//! ```

use super::{Attrs, Importer, Out, Val, call, invalid, kernel_attr, lift, req, spatial};
use crate::error::Result;
use crate::ir::{DType, Dim, ExprId};
use crate::op::{Op, Pool2dAttrs, ReduceAttrs, StridedSliceAttrs};

type Node = super::super::NodeProto;

/// `GlobalMaxPool`: `relax.max` over the spatial axes, kept.
pub(super) fn global_max_pool(im: &mut Importer<'_>, node: &Node) -> Result<Vec<Out>> {
    let x = im.expr(req(node, 0)?)?;
    let (dims, _) = im.dims(x)?;
    if dims.len() < 3 {
        return Err(invalid(format!(
            "GlobalMaxPool needs an input of rank ≥ 3, found rank {}",
            dims.len()
        )));
    }
    Ok(call(
        Op::Max(Box::new(ReduceAttrs {
            axis: Some((2..dims.len() as i64).collect()),
            keepdims: true,
        })),
        vec![x],
    ))
}

/// `|x|^p` (`x²` for p = 2).
fn abs_pow(im: &mut Importer<'_>, x: ExprId, p: f64, dt: DType) -> Result<ExprId> {
    if p == 2.0 {
        return im.emit(Op::Multiply, vec![x, x]);
    }
    let ax = im.emit(Op::Abs, vec![x])?;
    if p == 1.0 {
        return Ok(ax);
    }
    let pe = im.scalar(p, dt);
    im.emit(Op::Power, vec![ax, pe])
}

/// `s^(1/p)` as the final call.
fn root(im: &mut Importer<'_>, s: ExprId, p: f64, dt: DType) -> Vec<Out> {
    if p == 1.0 {
        return vec![Out::Val(Val::Expr(s))];
    }
    if p == 2.0 {
        return call(Op::Sqrt, vec![s]);
    }
    let q = im.scalar(1.0 / p, dt);
    call(Op::Power, vec![s, q])
}

fn lp_p(a: &Attrs<'_>) -> Result<f64> {
    let p = a.int("p", 2);
    if p < 1 {
        return Err(invalid(format!("`p` must be ≥ 1, found {p}")));
    }
    Ok(p as f64)
}

/// `GlobalLpPool`: `(Σ_spatial |x|^p)^(1/p)`, spatial axes kept.
pub(super) fn global_lp_pool(
    im: &mut Importer<'_>,
    node: &Node,
    a: &Attrs<'_>,
) -> Result<Vec<Out>> {
    let x = im.expr(req(node, 0)?)?;
    let (dims, dt) = im.dims(x)?;
    if dims.len() < 3 {
        return Err(invalid(format!(
            "GlobalLpPool needs an input of rank ≥ 3, found rank {}",
            dims.len()
        )));
    }
    let p = lp_p(a)?;
    let xp = abs_pow(im, x, p, dt)?;
    let s = im.emit(
        Op::Sum(Box::new(ReduceAttrs {
            axis: Some((2..dims.len() as i64).collect()),
            keepdims: true,
        })),
        vec![xp],
    )?;
    Ok(root(im, s, p, dt))
}

/// The pool attributes of a 1-D or 2-D `MaxPool` / `AveragePool` / `LpPool` node, the lifted
/// input, and whether it was lifted from 1-D.
fn pool_setup(
    im: &mut Importer<'_>,
    a: &Attrs<'_>,
    x: ExprId,
) -> Result<(ExprId, Box<Pool2dAttrs>, bool)> {
    let (xd, _) = im.dims(x)?;
    let one_d = xd.len() == 3;
    if !(one_d || xd.len() == 4) {
        return Err(invalid(format!(
            "unsupported ONNX node: only 1-D, 2-D and 3-D pooling is supported, found input \
             rank {}",
            xd.len()
        )));
    }
    let x = if one_d { lift(im, x)? } else { x };
    let (xd, _) = im.dims(x)?;
    let kernel = kernel_attr(a, one_d).ok_or_else(|| invalid("bad `kernel_shape`"))?;
    let (strides, dilation, padding) = spatial(a, &xd, kernel, one_d)?;
    let attrs = Box::new(Pool2dAttrs {
        pool_size: kernel,
        strides,
        dilation,
        padding,
        ceil_mode: a.int("ceil_mode", 0) != 0,
        count_include_pad: a.int("count_include_pad", 0) != 0,
        layout: "NCHW".into(),
        out_layout: "NCHW".into(),
    });
    check_pool(&attrs)?;
    Ok((x, attrs, one_d))
}

/// Checks the window attributes the importer builds directly (not through `from_call`).
fn check_pool(p: &Pool2dAttrs) -> Result<()> {
    let bad = p.pool_size.iter().any(|&v| v < 1)
        || p.strides.iter().any(|&v| v < 1)
        || p.dilation.iter().any(|&v| v < 1)
        || p.padding.iter().any(|&v| v < 0);
    if bad {
        return Err(invalid(format!(
            "pooling needs kernel, strides and dilations ≥ 1 and pads ≥ 0, found kernel {:?}, \
             strides {:?}, dilations {:?}, pads {:?}",
            p.pool_size, p.strides, p.dilation, p.padding
        )));
    }
    Ok(())
}

/// Per spatial axis, the output extent ONNX wants where `relax`'s ceil mode gives one more:
/// ONNX (like PyTorch) drops a last window that would start in the end padding.
fn ceil_overhang(im: &Importer<'_>, x: ExprId, p: &Pool2dAttrs) -> Result<Vec<(i64, i64)>> {
    if !p.ceil_mode {
        return Ok(vec![]);
    }
    let (xd, _) = im.dims(x)?;
    let mut cut = Vec::new();
    for i in 0..2 {
        let Some(len) = xd.get(2 + i).and_then(Dim::as_static) else {
            continue;
        };
        let (k, s, d) = (p.pool_size[i], p.strides[i], p.dilation[i]);
        let (p0, p1) = (p.padding[i], p.padding[i + 2]);
        // Saturating: attributes come from the model; absurd values only skip the rule here
        // (the pool's own inference reports them).
        let eff = k.saturating_sub(1).saturating_mul(d).saturating_add(1);
        let num = len
            .saturating_add(p0)
            .saturating_add(p1)
            .saturating_sub(eff);
        if num < 0 || s < 1 {
            continue;
        }
        let out = (num.saturating_add(s - 1) / s).saturating_add(1);
        if out > 1 && (out - 1).saturating_mul(s) >= len.saturating_add(p0) {
            cut.push((2 + i as i64, out - 1));
        }
    }
    Ok(cut)
}

/// The slice that drops the extra last windows found by [`ceil_overhang`].
fn cut_op(cut: &[(i64, i64)]) -> Option<Op> {
    if cut.is_empty() {
        return None;
    }
    Some(Op::StridedSlice(Box::new(StridedSliceAttrs {
        axes: cut.iter().map(|c| c.0).collect(),
        begin: vec![0; cut.len()],
        end: cut.iter().map(|c| c.1).collect(),
        strides: None,
        assume_inbound: false,
    })))
}

/// The squeeze that drops the lifted axis of a 1-D pool.
pub(super) fn unlift_op(one_d: bool) -> Option<Op> {
    one_d.then(|| Op::Squeeze {
        axis: Some(vec![3]),
    })
}

/// Applies unary `ops` in turn to `x`; the last is the node's output.
pub(super) fn chain(im: &mut Importer<'_>, x: ExprId, mut ops: Vec<Op>) -> Result<Vec<Out>> {
    let Some(last) = ops.pop() else {
        return Ok(vec![Out::Val(Val::Expr(x))]);
    };
    let mut y = x;
    for o in ops {
        y = im.emit(o, vec![y])?;
    }
    Ok(call(last, vec![y]))
}

/// What a 3-D pool computes per window.
#[derive(Clone, Copy, PartialEq)]
enum Pool3 {
    Max,
    Avg,
    /// The window sum (LpPool).
    Sum,
}

/// Per-axis (kernel, stride, dilation, pad begin, pad end) of a 3-D pool node.
fn pool3_axes(a: &Attrs<'_>, xd: &[Dim]) -> Result<[[i64; 5]; 3]> {
    let three = |name: &str, default: i64| -> Result<[i64; 3]> {
        match a.ints(name) {
            None => Ok([default; 3]),
            Some(v) if v.len() == 3 => Ok([v[0], v[1], v[2]]),
            Some(v) => Err(invalid(format!("`{name}` must have 3 values, found {v:?}"))),
        }
    };
    let k = three("kernel_shape", 0)?;
    if k.iter().any(|&v| v < 1) {
        return Err(invalid("bad `kernel_shape`"));
    }
    let s = three("strides", 1)?;
    let d = three("dilations", 1)?;
    let auto_pad = a.string("auto_pad", "NOTSET");
    let mut p = [0i64; 6];
    match auto_pad.as_str() {
        "NOTSET" | "" => {
            if let Some(v) = a.ints("pads") {
                p = v
                    .as_slice()
                    .try_into()
                    .map_err(|_| invalid(format!("`pads` must have 6 values, found {v:?}")))?;
            }
        }
        "VALID" => {}
        "SAME_UPPER" | "SAME_LOWER" => {
            for i in 0..3 {
                let n = xd
                    .get(2 + i)
                    .and_then(Dim::as_static)
                    .ok_or_else(|| invalid(format!("auto_pad {auto_pad} needs static dims")))?;
                let st = s[i].max(1);
                let out = n.saturating_add(st - 1) / st;
                let total = (out - 1)
                    .saturating_mul(st)
                    .saturating_add(k[i].saturating_sub(1).saturating_mul(d[i]))
                    .saturating_add(1)
                    .saturating_sub(n)
                    .max(0);
                let (lo, hi) = if auto_pad == "SAME_UPPER" {
                    (total / 2, total - total / 2)
                } else {
                    (total - total / 2, total / 2)
                };
                p[i] = lo;
                p[i + 3] = hi;
            }
        }
        other => return Err(invalid(format!("unknown auto_pad `{other}`"))),
    }
    Ok([0, 1, 2].map(|i| [k[i], s[i], d[i], p[i], p[i + 3]]))
}

/// One 2-D pooling stage with the ceil-mode rule applied.
fn pool_stage(
    im: &mut Importer<'_>,
    x: ExprId,
    ax: [[i64; 5]; 2],
    kind: Pool3,
    a: &Attrs<'_>,
) -> Result<ExprId> {
    let attrs = Box::new(Pool2dAttrs {
        pool_size: [ax[0][0], ax[1][0]],
        strides: [ax[0][1], ax[1][1]],
        dilation: [ax[0][2], ax[1][2]],
        padding: [ax[0][3], ax[1][3], ax[0][4], ax[1][4]],
        ceil_mode: a.int("ceil_mode", 0) != 0,
        count_include_pad: kind == Pool3::Sum || a.int("count_include_pad", 0) != 0,
        layout: "NCHW".into(),
        out_layout: "NCHW".into(),
    });
    check_pool(&attrs)?;
    let cut = ceil_overhang(im, x, &attrs)?;
    let op = if kind == Pool3::Max {
        Op::MaxPool2d(attrs)
    } else {
        Op::AvgPool2d(attrs)
    };
    let y = im.emit(op, vec![x])?;
    match cut_op(&cut) {
        Some(o) => im.emit(o, vec![y]),
        None => Ok(y),
    }
}

/// A 3-D pool as two separable 2-D pools: (H, W) over `[N, C·D, H, W]`, then D over
/// `[N·C, 1, D, H'·W']`. Max and window sums are separable; so is the average, whose divisor
/// (with or without padding counted) is a product of per-axis counts.
fn pool3d(im: &mut Importer<'_>, x: ExprId, a: &Attrs<'_>, kind: Pool3) -> Result<ExprId> {
    let (xd, _) = im.dims(x)?;
    let ax = pool3_axes(a, &xd)?;
    if kind == Pool3::Sum && a.int("ceil_mode", 0) != 0 {
        return Err(invalid("LpPool with ceil_mode=1 is not supported"));
    }
    let (n, c, d) = (xd[0].clone(), xd[1].clone(), xd[2].clone());
    let s =
        im.b.shape(vec![n.clone(), c.mul(&d), xd[3].clone(), xd[4].clone()]);
    let x1 = im.emit(Op::Reshape, vec![x, s])?;
    let y1 = pool_stage(im, x1, [ax[1], ax[2]], kind, a)?;
    let (y1d, _) = im.dims(y1)?;
    let (h2, w2) = (y1d[2].clone(), y1d[3].clone());
    let s = im.b.shape(vec![n.mul(&c), Dim::Static(1), d, h2.mul(&w2)]);
    let x2 = im.emit(Op::Reshape, vec![y1, s])?;
    let y2 = pool_stage(im, x2, [ax[0], [1, 1, 1, 0, 0]], kind, a)?;
    let (y2d, dt) = im.dims(y2)?;
    let s = im.b.shape(vec![n, c, y2d[2].clone(), h2, w2]);
    let y = im.emit(Op::Reshape, vec![y2, s])?;
    if kind != Pool3::Sum {
        return Ok(y);
    }
    let k = ax[0][0].saturating_mul(ax[1][0]).saturating_mul(ax[2][0]);
    let kc = im.scalar(k as f64, dt);
    im.emit(Op::Multiply, vec![y, kc])
}

/// `MaxPool` / `AveragePool` (1-D, 2-D and 3-D) with ONNX's ceil-mode rule.
pub(super) fn pool(im: &mut Importer<'_>, node: &Node, a: &Attrs<'_>) -> Result<Vec<Out>> {
    let x = im.expr(req(node, 0)?)?;
    if im.dims(x)?.0.len() == 5 {
        let kind = if node.op_type == "MaxPool" {
            Pool3::Max
        } else {
            Pool3::Avg
        };
        let y = pool3d(im, x, a, kind)?;
        return Ok(vec![Out::Val(Val::Expr(y))]);
    }
    let (x, attrs, one_d) = pool_setup(im, a, x)?;
    let cut = ceil_overhang(im, x, &attrs)?;
    if node.op_type == "MaxPool" && node.output.get(1).is_some_and(|s| !s.is_empty()) {
        // Values and Indices.
        let mut y = im.emit(Op::MaxPool2d(attrs.clone()), vec![x])?;
        if let Some(c) = cut_op(&cut) {
            y = im.emit(c, vec![y])?;
        }
        let (yd, _) = im.dims(y)?;
        let out_hw = match (yd[2].as_static(), yd[3].as_static()) {
            (Some(h), Some(w)) => (h, w),
            _ => {
                return Err(invalid(
                    "MaxPool's Indices output needs a static output shape",
                ));
            }
        };
        let mut idx =
            super::unpool::max_pool_indices(im, x, &attrs, out_hw, a.int("storage_order", 0))?;
        if let Some(u) = unlift_op(one_d) {
            y = im.emit(u.clone(), vec![y])?;
            idx = im.emit(u, vec![idx])?;
        }
        return Ok(vec![Out::Val(Val::Expr(y)), Out::Val(Val::Expr(idx))]);
    }
    let op = if node.op_type == "MaxPool" {
        Op::MaxPool2d(attrs)
    } else {
        Op::AvgPool2d(attrs)
    };
    let mut ops = vec![op];
    ops.extend(cut_op(&cut));
    ops.extend(unlift_op(one_d));
    chain(im, x, ops)
}

/// `LpPool` (1-D and 2-D): `(Σ_window |x|^p)^(1/p)`, the window sum being an average pool
/// with padding counted, times the window size.
pub(super) fn lp_pool(im: &mut Importer<'_>, node: &Node, a: &Attrs<'_>) -> Result<Vec<Out>> {
    let p = lp_p(a)?;
    let x0 = im.expr(req(node, 0)?)?;
    let (_, dt) = im.dims(x0)?;
    let xp = abs_pow(im, x0, p, dt)?;
    if im.dims(xp)?.0.len() == 5 {
        let y = pool3d(im, xp, a, Pool3::Sum)?;
        return Ok(root(im, y, p, dt));
    }
    let (x, mut attrs, one_d) = pool_setup(im, a, xp)?;
    if attrs.ceil_mode {
        // A partial last window would be averaged over fewer positions than the window.
        return Err(invalid("LpPool with ceil_mode=1 is not supported"));
    }
    attrs.count_include_pad = true;
    let k = attrs.pool_size[0].saturating_mul(attrs.pool_size[1]);
    let avg = im.emit(Op::AvgPool2d(attrs), vec![x])?;
    let kc = im.scalar(k as f64, dt);
    let s = im.emit(Op::Multiply, vec![avg, kc])?;
    let s = match unlift_op(one_d) {
        Some(o) => im.emit(o, vec![s])?,
        None => s,
    };
    Ok(root(im, s, p, dt))
}
