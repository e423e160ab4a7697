//! ONNX normalization, dropout, transposed convolution and resize nodes → the op set (issue
//! 17, `nn` family; the pools are in [`super::pool`]).
//!
//! Contract: each converter takes one node and returns one [`Out`] per output it supports, like
//! the arms of [`super::convert`]. Where the op set has the op (`relax.nn.layer_norm`,
//! `relax.nn.rms_norm`, `relax.nn.group_norm`, `relax.nn.instance_norm`, the 2-D pools,
//! `relax.nn.conv2d_transpose`, `relax.image.resize2d`) the node maps onto it; the rest are decomposed into
//! existing ops the way TVM's ONNX frontend decomposes them (mean/variance chains, pooling of
//! `|x|^p`). Optional outputs that need run-time randomness (training-mode Dropout with a
//! non-zero ratio) are errors, never silently wrong values.
//!
//! ```text
//! LayerNormalization(X, S, B; axis=-1) -> Y, Mean, InvStdDev
//!   y   = R.nn.layer_norm(X, S, B, axes=[-1], epsilon=1e-05, center=True, scale=True)
//!   lv  = R.mean(X, axis=[1], keepdims=True)            # Mean
//!   lv1 = R.subtract(X, lv); lv2 = R.multiply(lv1, lv1)
//!   lv3 = R.mean(lv2, axis=[1], keepdims=True)
//!   lv4 = R.add(lv3, R.const(1e-05)); inv = R.rsqrt(lv4)  # InvStdDev
//! GlobalMaxPool(X)  ->  R.max(X, axis=[2, 3], keepdims=True)
//! ```

use super::pool::{chain, unlift_op};
use super::{Attrs, Importer, Out, Val, call, finish, input, invalid, lift, normalize_axis, req};
use crate::error::Result;
use crate::ir::{Constant, DType, Dim, ExprId, ExprKind};
use crate::op::{
    Conv2dAttrs, Conv2dTransposeAttrs, F64, GroupNormAttrs, LayerNormAttrs, Op, ReduceAttrs,
    Resize2dAttrs, RmsNormAttrs, StridedSliceAttrs,
};

type Node = super::super::NodeProto;

fn mean_keep(im: &mut Importer<'_>, x: ExprId, axes: &[i64]) -> Result<ExprId> {
    im.emit(
        Op::Mean(Box::new(ReduceAttrs {
            axis: Some(axes.to_vec()),
            keepdims: true,
        })),
        vec![x],
    )
}

/// The mean and the centred input over `axes` (kept as extent-1 dims), and the variance.
fn moments(im: &mut Importer<'_>, x: ExprId, axes: &[i64]) -> Result<(ExprId, ExprId, ExprId)> {
    let m = mean_keep(im, x, axes)?;
    let d = im.emit(Op::Subtract, vec![x, m])?;
    let d2 = im.emit(Op::Multiply, vec![d, d])?;
    let v = mean_keep(im, d2, axes)?;
    Ok((m, d, v))
}

/// `1 / sqrt(v + eps)`.
fn inv_std(im: &mut Importer<'_>, v: ExprId, eps: f64, dt: DType) -> Result<ExprId> {
    let e = im.scalar(eps, dt);
    let ve = im.emit(Op::Add, vec![v, e])?;
    im.emit(Op::Rsqrt, vec![ve])
}

/// Whether output `k` of the node is wanted.
fn wants(node: &Node, k: usize) -> bool {
    node.output.get(k).is_some_and(|s| !s.is_empty())
}

/// A norm parameter as a tensor of exactly `want` (broadcast when it is smaller).
fn param_to(im: &mut Importer<'_>, name: &str, want: &[Dim]) -> Result<ExprId> {
    let p = im.expr(name)?;
    let (pd, _) = im.dims(p)?;
    if pd == want {
        return Ok(p);
    }
    if pd.len() > want.len() {
        return Err(invalid(format!(
            "a norm parameter of rank {} is wider than the normalised shape (rank {})",
            pd.len(),
            want.len()
        )));
    }
    let s = im.b.shape(want.to_vec());
    im.emit(Op::BroadcastTo, vec![p, s])
}

/// `LayerNormalization` (opset 17+): `relax.nn.layer_norm` over `axis..`, and the optional
/// `Mean` / `InvStdDev` outputs (in the stash type, float32 by default).
pub(super) fn layer_norm(im: &mut Importer<'_>, node: &Node, a: &Attrs<'_>) -> Result<Vec<Out>> {
    let x = im.expr(req(node, 0)?)?;
    let (dims, dt) = im.dims(x)?;
    let r = dims.len();
    let axis = normalize_axis(a.int("axis", -1), r)?;
    let eps = a.float("epsilon", 1e-5);
    let axes: Vec<i64> = (axis as i64..r as i64).collect();
    let gamma = param_to(im, req(node, 1)?, &dims[axis..])?;
    let (beta, center) = match input(node, 2) {
        Some(b) => (param_to(im, b, &dims[axis..])?, true),
        // `center=False` ignores beta: pass gamma again (same shape and dtype).
        None => (gamma, false),
    };
    let op = Op::LayerNorm(Box::new(LayerNormAttrs {
        axes: axes.clone(),
        epsilon: F64(eps),
        center,
        scale: true,
    }));
    if !wants(node, 1) && !wants(node, 2) {
        return Ok(call(op, vec![x, gamma, beta]));
    }
    let stash = match a.int("stash_type", 1) {
        1 => DType::F32,
        11 => DType::F64,
        10 => DType::F16,
        16 => DType::BF16,
        other => return Err(invalid(format!("unsupported stash_type {other}"))),
    };
    let xs = if stash == dt {
        x
    } else {
        im.emit(Op::Astype { dtype: stash }, vec![x])?
    };
    let (m, _, v) = moments(im, xs, &axes)?;
    let inv = inv_std(im, v, eps, stash)?;
    let mut outs = call(op, vec![x, gamma, beta]);
    outs.push(Out::Val(Val::Expr(m)));
    outs.push(Out::Val(Val::Expr(inv)));
    Ok(outs)
}

/// `RMSNormalization` (opset 23): `relax.nn.rms_norm` over `axis..`.
pub(super) fn rms_norm(im: &mut Importer<'_>, node: &Node, a: &Attrs<'_>) -> Result<Vec<Out>> {
    let x = im.expr(req(node, 0)?)?;
    let (dims, _) = im.dims(x)?;
    let r = dims.len();
    let axis = normalize_axis(a.int("axis", -1), r)?;
    let scale = param_to(im, req(node, 1)?, &dims[axis..])?;
    Ok(call(
        Op::RmsNorm(Box::new(RmsNormAttrs {
            axes: (axis as i64..r as i64).collect(),
            epsilon: F64(a.float("epsilon", 1e-5)),
        })),
        vec![x, scale],
    ))
}

/// `InstanceNormalization` → `relax.nn.instance_norm` over the spatial axes.
pub(super) fn instance_norm(im: &mut Importer<'_>, node: &Node, a: &Attrs<'_>) -> Result<Vec<Out>> {
    let x = im.expr(req(node, 0)?)?;
    let (dims, _) = im.dims(x)?;
    let r = dims.len();
    if r < 3 {
        return Err(invalid(format!(
            "InstanceNormalization needs an input of rank ≥ 3 (N, C, spatial…), found rank {r}"
        )));
    }
    let s = im.expr(req(node, 1)?)?;
    let b = im.expr(req(node, 2)?)?;
    Ok(call(
        Op::InstanceNorm(Box::new(GroupNormAttrs {
            num_groups: 0,
            channel_axis: 1,
            axes: (2..r as i64).collect(),
            epsilon: F64(a.float("epsilon", 1e-5)),
            center: true,
            scale: true,
        })),
        vec![x, s, b],
    ))
}

/// `GroupNormalization` → `relax.nn.group_norm`. Opset 21 takes scale/bias per channel; opset
/// 18's per-group scale/bias are spread to the channels with `relax.take`.
pub(super) fn group_norm(im: &mut Importer<'_>, node: &Node, a: &Attrs<'_>) -> Result<Vec<Out>> {
    let x = im.expr(req(node, 0)?)?;
    let (dims, _) = im.dims(x)?;
    let r = dims.len();
    if r < 3 {
        return Err(invalid(format!(
            "GroupNormalization needs an input of rank ≥ 3 (N, C, spatial…), found rank {r}"
        )));
    }
    let g = a.int("num_groups", 0);
    let c = dims[1]
        .as_static()
        .ok_or_else(|| invalid("GroupNormalization needs a static channel count"))?;
    if g < 1 || c % g != 0 {
        return Err(invalid(format!(
            "num_groups ({g}) must be ≥ 1 and divide the channel count ({c})"
        )));
    }
    let mut params = Vec::new();
    for i in [1, 2] {
        let p = im.expr(req(node, i)?)?;
        if im.opset >= 21 {
            params.push(p);
            continue;
        }
        // Channel k belongs to group k / (C / G).
        let cpg = c / g;
        let idx: Vec<i64> = (0..c).map(|k| k / cpg).collect();
        let ie = im.i64_const(vec![c], &idx)?;
        params.push(im.take(p, 0, ie)?);
    }
    Ok(call(
        Op::GroupNorm(Box::new(GroupNormAttrs {
            num_groups: g,
            channel_axis: 1,
            axes: (2..r as i64).collect(),
            epsilon: F64(a.float("epsilon", 1e-5)),
            center: true,
            scale: true,
        })),
        vec![x, params[0], params[1]],
    ))
}

/// `MeanVarianceNormalization`: `(x - E[x]) / (sqrt(E[x²] - E[x]²) + 1e-9)` over `axes`.
pub(super) fn mvn(im: &mut Importer<'_>, node: &Node, a: &Attrs<'_>) -> Result<Vec<Out>> {
    let x = im.expr(req(node, 0)?)?;
    let (dims, dt) = im.dims(x)?;
    let r = dims.len();
    let axes = a.ints("axes").unwrap_or_else(|| vec![0, 2, 3]);
    let axes: Vec<i64> = axes
        .iter()
        .map(|&v| normalize_axis(v, r).map(|v| v as i64))
        .collect::<Result<_>>()?;
    let m = mean_keep(im, x, &axes)?;
    let x2 = im.emit(Op::Multiply, vec![x, x])?;
    let ex2 = mean_keep(im, x2, &axes)?;
    let m2 = im.emit(Op::Multiply, vec![m, m])?;
    let var = im.emit(Op::Subtract, vec![ex2, m2])?;
    let std = im.emit(Op::Sqrt, vec![var])?;
    let e = im.scalar(1e-9, dt);
    let den = im.emit(Op::Add, vec![std, e])?;
    let d = im.emit(Op::Subtract, vec![x, m])?;
    Ok(call(Op::Divide, vec![d, den]))
}

/// `Dropout` at inference: the output is the input and the mask is all true. Training mode
/// with a non-zero ratio draws random numbers, which fusebox does not reproduce: an error.
pub(super) fn dropout(im: &mut Importer<'_>, node: &Node, a: &Attrs<'_>) -> Result<Vec<Out>> {
    let xv = im.val(req(node, 0)?)?;
    let training = if im.opset >= 12 {
        match input(node, 2) {
            Some(t) => im.const_f64s(t)?.first().is_some_and(|v| *v != 0.0),
            None => false,
        }
    } else {
        // Opsets before 7 had `is_test`; 7–11 are always inference.
        im.opset < 7 && a.int("is_test", 0) == 0
    };
    let ratio = if im.opset >= 12 {
        match input(node, 1) {
            Some(r) => im.const_f64s(r)?.first().copied().unwrap_or(0.5),
            None => 0.5,
        }
    } else {
        a.float("ratio", 0.5)
    };
    if training && ratio != 0.0 {
        return Err(invalid(format!(
            "training-mode Dropout with ratio {ratio} draws random numbers; only inference \
             (or ratio 0) is supported"
        )));
    }
    if !wants(node, 1) {
        return Ok(vec![Out::Val(xv)]);
    }
    let x = im.expr(req(node, 0)?)?;
    let (dims, _) = im.dims(x)?;
    let t = im.b.constant(Constant::scalar(1.0, DType::Bool));
    let s = im.b.shape(dims);
    Ok(vec![
        Out::Val(xv),
        Out::Kind(ExprKind::Call {
            callee: crate::ir::Callee::Op(Op::BroadcastTo),
            args: vec![t, s],
        }),
    ])
}

/// Python's floor division (ONNX's reference computes ConvTranspose pads with it).
fn floor_div2(v: i64) -> i64 {
    v.div_euclid(2)
}

/// `ConvTranspose` (1-D, 2-D) → `relax.nn.conv2d_transpose` (+ bias); 3-D → 2-D ones over
/// the depth slices ([`super::conv3d::conv_transpose3d`]). Explicit `pads`, `auto_pad` and
/// `output_shape` become padding and output padding.
pub(super) fn conv_transpose(
    im: &mut Importer<'_>,
    node: &Node,
    a: &Attrs<'_>,
) -> Result<Vec<Out>> {
    let mut x = im.expr(req(node, 0)?)?;
    let mut w = im.expr(req(node, 1)?)?;
    let (xd, _) = im.dims(x)?;
    let (wd, _) = im.dims(w)?;
    let nsp = xd.len().saturating_sub(2);
    if !(1..=3).contains(&nsp) || wd.len() != xd.len() {
        return Err(invalid(format!(
            "unsupported ONNX node: only 1-D, 2-D and 3-D transposed convolutions are \
             supported, found input rank {} and weight rank {}",
            xd.len(),
            wd.len()
        )));
    }
    super::check_kernel_shape(a, &wd)?;
    let g = transpose_geometry(a, &xd, &wd, nsp)?;
    let bias = input(node, 2).map(|b| im.expr(b)).transpose()?;
    if nsp == 3 {
        let y = super::conv3d::conv_transpose3d(im, x, w, &g)?;
        return super::conv3d::add_bias(im, y, bias);
    }
    let one_d = nsp == 1;
    let two = |v: &[i64], default: i64| [v[0], v.get(1).copied().unwrap_or(default)];
    let (b, e) = g.pads.split_at(nsp);
    let pads = [b[0], two(b, 0)[1], e[0], two(e, 0)[1]];
    if one_d {
        x = lift(im, x)?;
        w = lift(im, w)?;
    }
    let op = Op::Conv2dTranspose(Box::new(Conv2dTransposeAttrs {
        strides: two(&g.strides, 1),
        padding: pads,
        output_padding: two(&g.output_padding, 0),
        dilation: two(&g.dilations, 1),
        groups: g.group,
        data_layout: "NCHW".into(),
        kernel_layout: "IOHW".into(),
        out_layout: "NCHW".into(),
        out_dtype: None,
    }));
    let Some(b) = bias else {
        if !one_d {
            return Ok(call(op, vec![x, w]));
        }
        let y = im.emit(op, vec![x, w])?;
        return chain(im, y, unlift_op(one_d).into_iter().collect());
    };
    let y = im.emit(op, vec![x, w])?;
    let (bd, _) = im.dims(b)?;
    let [m] = bd.as_slice() else {
        return Err(invalid("ConvTranspose's bias must be 1-D"));
    };
    let s = im.b.shape(vec![
        Dim::Static(1),
        m.clone(),
        Dim::Static(1),
        Dim::Static(1),
    ]);
    let br = im.emit(Op::Reshape, vec![b, s])?;
    if !one_d {
        return Ok(call(Op::Add, vec![y, br]));
    }
    let y = im.emit(Op::Add, vec![y, br])?;
    chain(im, y, unlift_op(one_d).into_iter().collect())
}

/// A transposed convolution's attributes along `nsp` spatial axes, resolved: pads are
/// `[begin…, end…]`; `output_shape` and `auto_pad` are folded into pads and output padding.
pub(super) struct TransposeGeometry {
    pub(super) strides: Vec<i64>,
    pub(super) dilations: Vec<i64>,
    pub(super) kernel: Vec<i64>,
    pub(super) pads: Vec<i64>,
    pub(super) output_padding: Vec<i64>,
    pub(super) group: i64,
}

fn transpose_geometry(
    a: &Attrs<'_>,
    xd: &[Dim],
    wd: &[Dim],
    nsp: usize,
) -> Result<TransposeGeometry> {
    let per_axis = |name: &str, default: i64| -> Result<Vec<i64>> {
        match a.ints(name) {
            None => Ok(vec![default; nsp]),
            Some(v) if v.len() == nsp => Ok(v),
            Some(v) => Err(invalid(format!(
                "`{name}` must have {nsp} values, found {v:?}"
            ))),
        }
    };
    let strides = per_axis("strides", 1)?;
    let dil = per_axis("dilations", 1)?;
    let mut out_pad = per_axis("output_padding", 0)?;
    let kernel = match a.ints("kernel_shape") {
        Some(k) if k.len() == nsp => k,
        Some(k) => {
            return Err(invalid(format!(
                "`kernel_shape` must have {nsp} values, found {k:?}"
            )));
        }
        None => (0..nsp)
            .map(|i| wd.get(2 + i).and_then(Dim::as_static).unwrap_or(1))
            .collect(),
    };
    let group = a.int("group", 1);
    if strides.iter().chain(&dil).chain(&kernel).any(|&v| v < 1) || group < 1 {
        return Err(invalid(format!(
            "ConvTranspose needs strides, dilations, kernel_shape and group ≥ 1, found strides \
             {strides:?}, dilations {dil:?}, kernel {kernel:?}, group {group}"
        )));
    }
    let auto_pad = a.string("auto_pad", "NOTSET");
    let output_shape = a.ints("output_shape").map(|v| {
        let skip = v.len().saturating_sub(nsp);
        v[skip..].to_vec()
    });
    let in_ext = |i: usize| -> Result<i64> {
        xd.get(2 + i).and_then(Dim::as_static).ok_or_else(|| {
            invalid("ConvTranspose with output_shape or auto_pad needs static spatial dims")
        })
    };
    let mut pads = vec![0i64; 2 * nsp];
    let same = matches!(auto_pad.as_str(), "SAME_UPPER" | "SAME_LOWER");
    if output_shape.is_some() || same {
        for i in 0..nsp {
            let n = in_ext(i)?;
            let want = match &output_shape {
                Some(o) => *o
                    .get(i)
                    .ok_or_else(|| invalid("`output_shape` has too few values"))?,
                None => n.saturating_mul(strides[i]),
            };
            let full = strides[i]
                .saturating_mul(n - 1)
                .saturating_add(out_pad[i])
                .saturating_add(kernel[i].saturating_sub(1).saturating_mul(dil[i]))
                .saturating_add(1);
            let total = full.saturating_sub(want);
            let (b, e) = if auto_pad == "SAME_UPPER" {
                (floor_div2(total), total.saturating_sub(floor_div2(total)))
            } else {
                (total.saturating_sub(floor_div2(total)), floor_div2(total))
            };
            if b < 0 {
                return Err(invalid(format!(
                    "output_shape {want} needs more output than the transposed convolution \
                     gives at the start of axis {i}"
                )));
            }
            pads[i] = b;
            if e < 0 {
                out_pad[i] = out_pad[i].saturating_sub(e);
            } else {
                pads[i + nsp] = e;
            }
        }
    } else if matches!(auto_pad.as_str(), "NOTSET" | "" | "VALID") {
        if auto_pad != "VALID"
            && let Some(p) = a.ints("pads")
        {
            if p.len() != 2 * nsp {
                return Err(invalid(format!(
                    "`pads` must have {} values, found {p:?}",
                    2 * nsp
                )));
            }
            pads = p;
        }
    } else {
        return Err(invalid(format!("unknown auto_pad `{auto_pad}`")));
    }
    if pads.iter().any(|&p| p < 0) || out_pad.iter().any(|&p| p < 0) {
        return Err(invalid(format!(
            "negative pads {pads:?} / output_padding {out_pad:?} are not supported"
        )));
    }
    Ok(TransposeGeometry {
        strides,
        dilations: dil,
        kernel,
        pads,
        output_padding: out_pad,
        group,
    })
}

/// `Resize` (opsets 10–19) of a 4-D tensor's two spatial axes → `relax.image.resize2d`. The
/// scales / sizes / roi inputs must be known at import (sizes may hold the input's own symbolic
/// N and C, as `Concat(Shape(x)[:2], [h, w])` does); N and C must keep their extents. A 3-D
/// `(N, C, L)` tensor (`F.interpolate` of a sequence: SAM's relative positions) resizes as
/// `(N, C, L, 1)`, as the 1-D convolutions are lifted, and is squeezed back.
pub(super) fn resize(im: &mut Importer<'_>, node: &Node, a: &Attrs<'_>) -> Result<Vec<Out>> {
    let x = im.expr(req(node, 0)?)?;
    let rank = im.dims(x)?.0.len();
    if rank != 3 && rank != 4 {
        return Err(invalid(format!(
            "unsupported ONNX node: Resize of a rank-{rank} tensor (only 3-D NCL or 4-D NCHW)"
        )));
    }
    let one_d = rank == 3;
    let x = if one_d { lift(im, x)? } else { x };
    let (xd, _) = im.dims(x)?;
    let (ih, iw) = match (xd[2].as_static(), xd[3].as_static()) {
        (Some(h), Some(w)) => (h, w),
        _ => return Err(invalid("Resize needs static spatial dims")),
    };
    let axes = match a.ints("axes") {
        None => (0..rank).collect(),
        Some(v) => v
            .iter()
            .map(|&ax| normalize_axis(ax, rank))
            .collect::<Result<Vec<_>>>()?,
    };
    let (scales_in, sizes_in, roi_in) = if im.opset < 11 {
        (input(node, 1), None, None)
    } else {
        (input(node, 2), input(node, 3), input(node, 1))
    };
    let mut mode = a.string("mode", "nearest");
    let (coord, rounding) = if im.opset < 11 {
        ("asymmetric".to_string(), "floor".to_string())
    } else {
        (
            a.string("coordinate_transformation_mode", "half_pixel"),
            a.string("nearest_mode", "round_prefer_floor"),
        )
    };
    // Per-axis scale (when given) and output extent of H and W; N and C (symbolic or not:
    // `sizes` is often `Concat(Shape(x)[:2], [h, w])`) must keep their extents.
    let in_ext = [None, None, Some(ih), Some(iw)];
    let mut out = [0i64; 4];
    let mut scale = [1.0f64; 4];
    let sizes = match sizes_in {
        Some(n) => Some(im.const_dims(n)?),
        None => None,
    };
    let scales = match (scales_in, &sizes) {
        (Some(n), None) => {
            let v = im.const_f64s(n)?;
            (!v.is_empty()).then_some(v)
        }
        _ => None,
    };
    let batch_or_channel =
        || invalid("Resize of the batch or channel axis is not supported (only H and W)");
    for (k, ax) in axes.iter().enumerate() {
        match (&sizes, &scales) {
            (Some(s), _) => {
                let v = s
                    .get(k)
                    .ok_or_else(|| invalid("`sizes` has fewer values than `axes`"))?;
                if *ax < 2 {
                    if !v.provably_eq(&xd[*ax]) {
                        return Err(batch_or_channel());
                    }
                    continue;
                }
                let v = v.as_static().ok_or_else(|| {
                    invalid(format!(
                        "Resize's output {} must be static, found symbolic dim `{v}`",
                        if *ax == 2 { "height" } else { "width" }
                    ))
                })?;
                out[*ax] = v;
                scale[*ax] = v as f64 / in_ext[*ax].unwrap_or(1) as f64;
            }
            (None, Some(s)) => {
                scale[*ax] = *s
                    .get(k)
                    .ok_or_else(|| invalid("`scales` has fewer values than `axes`"))?;
                if *ax < 2 && scale[*ax] != 1.0 {
                    return Err(batch_or_channel());
                }
            }
            (None, None) => return Err(invalid("Resize needs `scales` or `sizes`")),
        }
    }
    if sizes.is_some() {
        let policy = a.string("keep_aspect_ratio_policy", "stretch");
        if policy != "stretch" {
            let sp: Vec<f64> = axes
                .iter()
                .filter(|&&ax| ax >= 2)
                .map(|&ax| scale[ax])
                .collect();
            let pick = match policy.as_str() {
                "not_larger" => sp.iter().copied().fold(f64::INFINITY, f64::min),
                "not_smaller" => sp.iter().copied().fold(0.0, f64::max),
                other => {
                    return Err(invalid(format!(
                        "unknown keep_aspect_ratio_policy `{other}`"
                    )));
                }
            };
            for &ax in axes.iter().filter(|&&ax| ax >= 2) {
                scale[ax] = pick;
                out[ax] = (pick * in_ext[ax].unwrap_or(1) as f64).round() as i64;
            }
        }
    }
    for ax in 2..4 {
        let i = in_ext[ax].unwrap_or(1);
        if !axes.contains(&ax) {
            scale[ax] = 1.0;
            out[ax] = i;
        } else if sizes.is_none() {
            // Scales are float32: a product within float32 rounding of an integer is that
            // integer.
            let exact = i as f64 * scale[ax];
            out[ax] = if (exact - exact.round()).abs() <= 1e-5 * exact.abs().max(1.0) {
                exact.round() as i64
            } else {
                exact.floor() as i64
            };
        }
    }
    // ONNX maps coordinates with the given scale, relax.image.resize2d with the size ratio:
    // the two agree when the output extent is exactly `scale · input`; otherwise the op
    // carries the scales.
    let inexact = |ax: usize| {
        let exact = in_ext[ax].unwrap_or(0) as f64 * scale[ax];
        (exact - out[ax] as f64).abs() > 1e-5 * exact.abs().max(1.0)
    };
    let explicit = (inexact(2) || inexact(3)).then_some([F64(scale[2]), F64(scale[3])]);
    if out[2] < 1 || out[3] < 1 {
        return Err(invalid(format!(
            "Resize gives an empty output ({} x {})",
            out[2], out[3]
        )));
    }
    let mut roi = [F64(0.0); 4];
    if coord == "tf_crop_and_resize" {
        let r = match roi_in {
            Some(n) => im.const_f64s(n)?,
            None => vec![],
        };
        let k = axes.len();
        if r.len() == 2 * k {
            for (j, &ax) in axes.iter().enumerate() {
                if ax >= 2 {
                    roi[ax - 2] = F64(r[j]);
                    roi[ax] = F64(r[k + j]);
                }
            }
        } else if !r.is_empty() {
            return Err(invalid(format!(
                "`roi` must have {} values, found {}",
                2 * k,
                r.len()
            )));
        }
    }
    if mode == "nearest" {
        mode = "nearest_neighbor".to_string();
    }
    let antialias = a.int("antialias", 0) != 0 && mode != "nearest_neighbor";
    let size = im.b.shape(vec![Dim::Static(out[2]), Dim::Static(out[3])]);
    finish(
        im,
        Op::Resize2d(Box::new(Resize2dAttrs {
            roi,
            layout: "NCHW".into(),
            method: mode,
            coordinate_transformation_mode: coord,
            rounding_method: rounding,
            cubic_alpha: F64(a.float("cubic_coeff_a", -0.75)),
            cubic_exclude: a.int("exclude_outside", 0),
            extrapolation_value: F64(a.float("extrapolation_value", 0.0)),
            out_dtype: None,
            scale: explicit,
            antialias,
        })),
        vec![x, size],
        one_d,
    )
}

/// `CausalConvWithState` (opset 27): a depthwise causal Conv1d whose left context is the
/// `past_state` input (zeros when absent), with an optional fused SiLU; the second output is the
/// last `k - 1` positions of the padded input (the next call's state).
///
/// ```text
/// padded = R.concat((past_state, x), axis=2)                   # (B, C, L + k - 1)
/// y = R.squeeze(R.nn.conv2d(R.expand_dims(padded, [3]), R.expand_dims(w, [3]), groups=C), [3])
/// present_state = R.strided_slice(padded, axes=[2], begin=[L], end=[L + k - 1])
/// ```
pub(super) fn causal_conv_with_state(
    im: &mut Importer<'_>,
    node: &Node,
    a: &Attrs<'_>,
) -> Result<Vec<Out>> {
    let x = im.expr(req(node, 0)?)?;
    let w = im.expr(req(node, 1)?)?;
    let (xd, dt) = im.dims(x)?;
    let (wd, _) = im.dims(w)?;
    let ([b, c, l], [wc, w1, k]) = (xd.as_slice(), wd.as_slice()) else {
        return Err(invalid(format!(
            "CausalConvWithState needs a rank-3 input and weight, found ranks {} and {}",
            xd.len(),
            wd.len()
        )));
    };
    let k = k
        .as_static()
        .filter(|&k| k >= 1)
        .ok_or_else(|| invalid("CausalConvWithState needs a static kernel size ≥ 1"))?;
    if *w1 != Dim::Static(1) || wc != c {
        return Err(invalid(format!(
            "CausalConvWithState's weight must be (channels, 1, k) = ({c}, 1, k), found ({wc}, {w1}, {k})"
        )));
    }
    let groups = c
        .as_static()
        .ok_or_else(|| invalid("CausalConvWithState needs a static channel count"))?;
    let activation = a.string("activation", "none");
    if !matches!(activation.as_str(), "none" | "silu" | "swish") {
        return Err(invalid(format!(
            "unknown activation `{activation}` (expected none, silu or swish)"
        )));
    }
    let state_len = Dim::Static(k - 1);
    let padded = if k == 1 {
        x
    } else {
        let past = match input(node, 3) {
            Some(p) => im.expr(p)?,
            None => {
                let z = im.scalar(0.0, dt);
                let s = im.b.shape(vec![b.clone(), c.clone(), state_len.clone()]);
                im.emit(Op::BroadcastTo, vec![z, s])?
            }
        };
        let t = im.b.tuple(vec![past, x])?;
        im.emit(Op::Concat { axis: Some(2) }, vec![t])?
    };
    let total = l.add(&state_len);
    let present = match (l.as_static(), total.as_static()) {
        (Some(lv), Some(tv)) => im.emit(
            Op::StridedSlice(Box::new(StridedSliceAttrs {
                axes: vec![2],
                begin: vec![lv],
                end: vec![tv],
                strides: None,
                assume_inbound: false,
            })),
            vec![padded],
        )?,
        _ => return Err(invalid("CausalConvWithState needs a static input length")),
    };
    let p4 = lift(im, padded)?;
    let w4 = lift(im, w)?;
    let conv = Op::Conv2d(Box::new(Conv2dAttrs {
        strides: [1, 1],
        padding: [0; 4],
        dilation: [1, 1],
        groups,
        data_layout: "NCHW".into(),
        kernel_layout: "OIHW".into(),
        out_layout: "NCHW".into(),
        out_dtype: None,
    }));
    let mut y = im.emit(conv, vec![p4, w4])?;
    if let Some(bn) = input(node, 2) {
        let bias = im.expr(bn)?;
        let s = im.b.shape(vec![
            Dim::Static(1),
            c.clone(),
            Dim::Static(1),
            Dim::Static(1),
        ]);
        let br = im.emit(Op::Reshape, vec![bias, s])?;
        y = im.emit(Op::Add, vec![y, br])?;
    }
    let mut ops: Vec<Op> = unlift_op(true).into_iter().collect();
    if activation != "none" {
        ops.push(Op::Silu);
    }
    let mut outs = chain(im, y, ops)?;
    outs.push(Out::Val(Val::Expr(present)));
    Ok(outs)
}

#[cfg(test)]
mod tests {
    use super::super::super::proto::*;
    use super::super::super::{import_onnx, output_names};
    use crate::ir::{Module, Type};
    use crate::text::print_module;
    use prost::Message;

    fn vi(name: &str, dims: &[&str]) -> ValueInfoProto {
        let dim = dims
            .iter()
            .map(|d| match d.parse::<i64>() {
                Ok(v) => Dimension {
                    dim_value: Some(v),
                    dim_param: None,
                },
                Err(_) => Dimension {
                    dim_value: None,
                    dim_param: Some(d.to_string()),
                },
            })
            .collect();
        ValueInfoProto {
            name: name.into(),
            r#type: Some(TypeProto {
                tensor_type: Some(TypeProtoTensor {
                    elem_type: 1,
                    shape: Some(TensorShapeProto { dim }),
                }),
            }),
        }
    }

    fn ints(name: &str, v: &[i64]) -> AttributeProto {
        AttributeProto {
            name: name.into(),
            ints: v.to_vec(),
            r#type: 7,
            ..Default::default()
        }
    }

    fn int(name: &str, i: i64) -> AttributeProto {
        AttributeProto {
            name: name.into(),
            i,
            r#type: 2,
            ..Default::default()
        }
    }

    fn text_attr(name: &str, s: &str) -> AttributeProto {
        AttributeProto {
            name: name.into(),
            s: s.as_bytes().to_vec(),
            r#type: 3,
            ..Default::default()
        }
    }

    fn i64s(name: &str, dims: &[i64], v: &[i64]) -> TensorProto {
        TensorProto {
            name: name.into(),
            dims: dims.to_vec(),
            data_type: 7,
            int64_data: v.to_vec(),
            ..Default::default()
        }
    }

    fn f32s(name: &str, dims: &[i64], v: &[f32]) -> TensorProto {
        TensorProto {
            name: name.into(),
            dims: dims.to_vec(),
            data_type: 1,
            float_data: v.to_vec(),
            ..Default::default()
        }
    }

    fn one_node(
        opset: i64,
        op: &str,
        ins: &[&str],
        outs: &[&str],
        attrs: Vec<AttributeProto>,
        inputs: Vec<ValueInfoProto>,
        inits: Vec<TensorProto>,
    ) -> Result<Module, String> {
        let m = ModelProto {
            ir_version: 8,
            producer_name: "test".into(),
            graph: Some(GraphProto {
                node: vec![NodeProto {
                    input: ins.iter().map(|s| s.to_string()).collect(),
                    output: outs.iter().map(|s| s.to_string()).collect(),
                    name: "n".into(),
                    op_type: op.into(),
                    attribute: attrs,
                    domain: String::new(),
                }],
                name: "g".into(),
                initializer: inits,
                input: inputs,
                output: outs
                    .iter()
                    .map(|o| ValueInfoProto {
                        name: o.to_string(),
                        r#type: None,
                    })
                    .collect(),
                value_info: vec![],
            }),
            opset_import: vec![OperatorSetIdProto {
                domain: String::new(),
                version: opset,
            }],
        };
        import_onnx(&m.encode_to_vec(), "t.onnx").map_err(|e| e.to_string())
    }

    fn ret(m: &Module) -> Type {
        m.get("main").map(|f| f.ret_ty.clone()).unwrap_or_default()
    }

    #[test]
    fn grid_sample_and_affine_grid_import_with_channel_first_grids() {
        // opset 20's mode names; the grid is permuted to (N, 2, Ho, Wo).
        let m = one_node(
            20,
            "GridSample",
            &["x", "g"],
            &["y"],
            vec![
                text_attr("mode", "cubic"),
                text_attr("padding_mode", "border"),
                int("align_corners", 1),
            ],
            vec![
                vi("x", &["1", "3", "4", "5"]),
                vi("g", &["1", "6", "7", "2"]),
            ],
            vec![],
        )
        .unwrap_or_else(|e| unreachable!("{e}"));
        let t = print_module(&m).text;
        assert!(t.contains("R.permute_dims(g, axes=[0, 3, 1, 2])"), "{t}");
        assert!(
            t.contains(
                "method=\"bicubic\", layout=\"NCHW\", padding_mode=\"border\", align_corners=True"
            ),
            "{t}"
        );
        assert_eq!(ret(&m), Type::tensor(&[1, 3, 6, 7], crate::ir::DType::F32));
        // Volumetric: NCDHW; cubic is 2-D only.
        let volumetric = |mode: &str| {
            one_node(
                16,
                "GridSample",
                &["x", "g"],
                &["y"],
                vec![text_attr("mode", mode)],
                vec![
                    vi("x", &["2", "1", "3", "4", "5"]),
                    vi("g", &["2", "2", "2", "2", "3"]),
                ],
                vec![],
            )
        };
        let m = volumetric("nearest").unwrap_or_else(|e| unreachable!("{e}"));
        assert_eq!(
            ret(&m),
            Type::tensor(&[2, 1, 2, 2, 2], crate::ir::DType::F32)
        );
        let e = volumetric("bicubic").err().unwrap_or_default();
        assert!(e.contains("4-D input"), "{e}");
        // AffineGrid: the size is a constant; the grid comes back channel-last.
        let affine = |size: &[i64]| {
            one_node(
                20,
                "AffineGrid",
                &["theta", "size"],
                &["grid"],
                vec![],
                vec![vi("theta", &["2", "2", "3"])],
                vec![i64s("size", &[4], size)],
            )
        };
        let m = affine(&[2, 3, 4, 5]).unwrap_or_else(|e| unreachable!("{e}"));
        let t = print_module(&m).text;
        assert!(
            t.contains("R.image.affine_grid(theta, R.shape([4, 5]), align_corners=False)"),
            "{t}"
        );
        assert_eq!(ret(&m), Type::tensor(&[2, 4, 5, 2], crate::ir::DType::F32));
        let e = affine(&[3, 3, 4, 5]).err().unwrap_or_default();
        assert!(e.contains("batch of 3"), "{e}");
    }

    #[test]
    fn resize_with_constant_scales_and_a_fractional_scale() {
        let m = one_node(
            13,
            "Resize",
            &["x", "", "s"],
            &["y"],
            vec![text_attr("mode", "linear")],
            vec![vi("x", &["1", "3", "4", "5"])],
            vec![f32s("s", &[4], &[1.0, 1.0, 2.0, 0.6])],
        )
        .unwrap_or_else(|e| unreachable!("{e}"));
        let t = print_module(&m).text;
        assert!(t.contains("R.image.resize2d(x, R.shape([8, 3])"), "{t}");
        assert!(t.contains("method=\"linear\""), "{t}");
        assert_eq!(ret(&m), Type::tensor(&[1, 3, 8, 3], crate::ir::DType::F32));
        // 3 × 1.5 = 4.5 rows: ONNX floors to 4 and maps coordinates with 1.5 itself, so the
        // op carries the scales (the size ratio 4 / 3 would be another resampling).
        let m = one_node(
            13,
            "Resize",
            &["x", "", "s"],
            &["y"],
            vec![],
            vec![vi("x", &["1", "3", "3", "5"])],
            vec![f32s("s", &[4], &[1.0, 1.0, 1.5, 1.0])],
        )
        .unwrap_or_else(|e| unreachable!("{e}"));
        let t = print_module(&m).text;
        assert!(
            t.contains("R.image.resize2d(x, R.shape([4, 5])") && t.contains("scale=[1.5, 1.0]"),
            "{t}"
        );
        let e = one_node(
            13,
            "Resize",
            &["x", "", "s"],
            &["y"],
            vec![],
            vec![vi("x", &["1", "3", "4", "4"])],
            vec![f32s("s", &[4], &[1.0, 2.0, 1.0, 1.0])],
        )
        .err()
        .unwrap_or_default();
        assert!(e.contains("channel"), "{e}");
    }

    #[test]
    fn conv_transpose_output_shape_becomes_padding_and_output_padding() {
        // 3 × 3 input, stride 3, 3 × 3 kernel: the full output is 9 × 9; output_shape 10 × 8
        // needs one extra row at the end (output padding) and drops one column at the start.
        let m = one_node(
            13,
            "ConvTranspose",
            &["x", "w"],
            &["y"],
            vec![ints("strides", &[3, 3]), ints("output_shape", &[10, 8])],
            vec![vi("x", &["1", "1", "3", "3"])],
            vec![f32s("w", &[1, 2, 3, 3], &[1.0; 18])],
        )
        .unwrap_or_else(|e| unreachable!("{e}"));
        let t = print_module(&m).text;
        assert!(t.contains("padding=[0, 1, 0, 0]"), "{t}");
        assert!(t.contains("output_padding=[1, 0]"), "{t}");
        assert_eq!(ret(&m), Type::tensor(&[1, 2, 10, 8], crate::ir::DType::F32));
        let e = one_node(
            13,
            "ConvTranspose",
            &["x", "w"],
            &["y"],
            vec![],
            vec![vi("x", &["1", "1", "3", "3", "3", "3"])],
            vec![f32s("w", &[1, 2, 3, 3, 3, 3], &[1.0; 162])],
        )
        .err()
        .unwrap_or_default();
        assert!(e.contains("1-D, 2-D and 3-D"), "{e}");
    }

    #[test]
    fn layer_norm_statistics_outputs_keep_symbolic_dims() {
        let m = one_node(
            17,
            "LayerNormalization",
            &["x", "g"],
            &["y", "mean", "inv"],
            vec![int("axis", 1)],
            vec![vi("x", &["n", "2", "3"])],
            vec![f32s("g", &[2, 3], &[1.0; 6])],
        )
        .unwrap_or_else(|e| unreachable!("{e}"));
        let t = print_module(&m).text;
        assert!(t.contains("center=False"), "{t}");
        let f = m.get("main").unwrap_or_else(|| unreachable!());
        assert_eq!(output_names(f), vec!["y", "mean", "inv"]);
        let Type::Tuple(fields) = ret(&m) else {
            unreachable!("{t}")
        };
        let n = crate::ir::Dim::sym("n");
        let st = |d: Vec<crate::ir::Dim>| Type::tensor_dims(d, crate::ir::DType::F32);
        use crate::ir::Dim::Static as S;
        assert_eq!(fields[1], st(vec![n.clone(), S(1), S(1)]));
        assert_eq!(fields[2], st(vec![n, S(1), S(1)]));
    }

    #[test]
    fn ceil_mode_drops_a_last_window_that_starts_in_the_padding() {
        // 4 wide, kernel 2, stride 3, pad 1 at the end, ceil: windows start at 0 and 3 (ceil
        // gives a third at 6, inside the end padding only) → 2 outputs.
        let m = one_node(
            13,
            "MaxPool",
            &["x"],
            &["y"],
            vec![
                ints("kernel_shape", &[2, 2]),
                ints("strides", &[3, 3]),
                ints("pads", &[0, 0, 1, 1]),
                int("ceil_mode", 1),
            ],
            vec![vi("x", &["1", "1", "4", "5"])],
            vec![],
        )
        .unwrap_or_else(|e| unreachable!("{e}"));
        let t = print_module(&m).text;
        assert!(t.contains("R.strided_slice"), "{t}");
        assert_eq!(ret(&m), Type::tensor(&[1, 1, 2, 2], crate::ir::DType::F32));
        // 3-D: separable 2-D stages, the right output shape.
        let m = one_node(
            13,
            "AveragePool",
            &["x"],
            &["y"],
            vec![
                ints("kernel_shape", &[2, 3, 2]),
                ints("pads", &[1, 0, 0, 0, 1, 1]),
            ],
            vec![vi("x", &["2", "3", "4", "5", "6"])],
            vec![],
        )
        .unwrap_or_else(|e| unreachable!("{e}"));
        assert_eq!(
            ret(&m),
            Type::tensor(&[2, 3, 4, 4, 6], crate::ir::DType::F32)
        );
    }
}
