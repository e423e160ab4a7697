//! ONNX → op-set conversions of the indexing, shape and layout ops of issue 17.
//!
//! Contract: [`convert`] handles GatherElements, GatherND, ScatterND, ScatterElements (and the
//! deprecated Scatter), TensorScatter, OneHot, Range, Tile, Trilu, CumSum, CumProd, Pad,
//! CenterCropPad, Size, DepthToSpace and SpaceToDepth with ONNX semantics per opset (attributes in old opsets, inputs in new
//! ones); it returns `Ok(None)` for other op types. Inputs that shape the result (`depth`,
//! `repeats`, `pads`, `k`, Range's bounds, the scan axis) must be constants computed at import
//! time; a value computed at run time is an error naming the input. Data-dependent shapes
//! (NonZero, Unique, Compress) stay unsupported: the importer names those nodes.
//!
//! ```text
//! Trilu(x, k=1; upper=0)        →  y = R.tril(x, k=1)
//! CumSum(x, 1; reverse=1)       →  lv = R.strided_slice(x, axes=[1], begin=[-1], end=[-5], strides=[-1])
//!                                  lv1 = R.cumsum(lv, axis=1, dtype=None, exclusive=False)
//!                                  y = R.strided_slice(lv1, axes=[1], begin=[-1], end=[-5], strides=[-1])
//! Pad(x, [0, 1, 0, 1]; mode=edge) →  y = R.nn.pad(x, pad_width=[0, 0, 1, 1], pad_value=0.0, pad_mode="replicate")
//! ```

use super::super::{Attrs, Importer, Out, Val, input, invalid, normalize_axis, req};
use super::call;
use crate::error::Result;
use crate::ir::{Constant, DType, Dim, ExprId};
use crate::op::{
    ArangeAttrs, F64, Op, PadAttrs, PadMode, ScanAttrs, ScatterReduction, StridedSliceAttrs,
    TakeMode,
};

/// Integer `Range`s up to this many elements fold to constants at import time.
const MAX_FOLDED_RANGE: i64 = 1 << 16;

fn reduction(a: &Attrs<'_>) -> Result<ScatterReduction> {
    let s = a.string("reduction", "none");
    ScatterReduction::from_name(&s)
        .filter(|r| *r != ScatterReduction::Mean)
        .ok_or_else(|| {
            invalid(format!(
                "unknown reduction `{s}` (expected none, add, mul, max or min)"
            ))
        })
}

/// A scalar constant input as an integer.
fn const_int(im: &Importer<'_>, name: &str, what: &str) -> Result<i64> {
    let v = im.const_f64s(name)?;
    match v.as_slice() {
        [x] if x.fract() == 0.0 => Ok(*x as i64),
        _ => Err(invalid(format!(
            "`{what}` must be one integer, found {v:?}"
        ))),
    }
}

/// `x` reversed along `axis` (a strided slice with step -1).
fn flip(im: &mut Importer<'_>, x: ExprId, axis: usize) -> Result<ExprId> {
    let (dims, _) = im.dims(x)?;
    let n = dims
        .get(axis)
        .and_then(Dim::as_static)
        .ok_or_else(|| invalid("reverse=1 needs a static extent on the scanned axis"))?;
    im.emit(
        Op::StridedSlice(Box::new(StridedSliceAttrs {
            axes: vec![axis as i64],
            begin: vec![-1],
            end: vec![-n - 1],
            strides: Some(vec![-1]),
            assume_inbound: false,
        })),
        vec![x],
    )
}

/// An integer index tensor: float indices (OneHot allows them) become int64.
fn int_index(im: &mut Importer<'_>, e: ExprId) -> Result<ExprId> {
    let (_, dt) = im.dims(e)?;
    if dt.is_int() {
        Ok(e)
    } else {
        im.emit(Op::Astype { dtype: DType::I64 }, vec![e])
    }
}

/// Converts a node of this family; `Ok(None)` for other op types.
pub(super) fn convert(
    im: &mut Importer<'_>,
    node: &super::super::NodeProto,
) -> Result<Option<Vec<Out>>> {
    let a = Attrs(node);
    let op = node.op_type.as_str();
    Ok(Some(match op {
        "GatherElements" => {
            let x = im.expr(req(node, 0)?)?;
            let i = im.expr(req(node, 1)?)?;
            call(
                Op::GatherElements {
                    axis: a.int("axis", 0),
                },
                vec![x, i],
            )
        }
        "GatherND" => {
            let x = im.expr(req(node, 0)?)?;
            let i = im.expr(req(node, 1)?)?;
            call(
                Op::GatherNd {
                    batch_dims: a.int("batch_dims", 0),
                },
                vec![x, i],
            )
        }
        "ScatterND" => {
            let x = im.expr(req(node, 0)?)?;
            let i = im.expr(req(node, 1)?)?;
            let u = im.expr(req(node, 2)?)?;
            call(
                Op::ScatterNd {
                    reduction: reduction(&a)?,
                },
                vec![x, i, u],
            )
        }
        "ScatterElements" | "Scatter" => {
            let x = im.expr(req(node, 0)?)?;
            let i = im.expr(req(node, 1)?)?;
            let u = im.expr(req(node, 2)?)?;
            call(
                Op::ScatterElements {
                    axis: a.int("axis", 0),
                    reduction: reduction(&a)?,
                },
                vec![x, i, u],
            )
        }
        "OneHot" => {
            let i = im.expr(req(node, 0)?)?;
            let i = int_index(im, i)?;
            let depth = const_int(im, req(node, 1)?, "depth")?;
            if depth < 0 {
                return Err(invalid(format!(
                    "depth must not be negative, found {depth}"
                )));
            }
            let vname = req(node, 2)?;
            let values = match im.val(vname)? {
                Val::Const(c) => Some(c),
                Val::Ints(i) => i.to_constant(),
                Val::Expr(_) => None,
            };
            let (off, on) = match values {
                Some(values) => {
                    if values.numel() != 2 {
                        return Err(invalid(format!(
                            "`values` must hold 2 elements [off_value, on_value], found shape {:?}",
                            values.shape
                        )));
                    }
                    let sz = values.dtype.size_bytes();
                    let scalar = |k: usize| {
                        Constant::from_bytes(
                            values.dtype,
                            vec![],
                            values
                                .data
                                .get(k * sz..(k + 1) * sz)
                                .unwrap_or(&[])
                                .to_vec(),
                        )
                        .map_err(invalid)
                    };
                    (im.b.constant(scalar(0)?), im.b.constant(scalar(1)?))
                }
                None => {
                    // Computed at run time: elements 0 and 1 as rank-0 tensors.
                    let v = im.expr(vname)?;
                    let (vd, _) = im.dims(v)?;
                    if vd != [Dim::Static(2)] {
                        return Err(invalid(format!(
                            "`values` must have shape [2] ([off_value, on_value]), found {vd:?}"
                        )));
                    }
                    let mut pick = |k: i64| -> Result<ExprId> {
                        let i = im.b.constant(Constant::scalar_i64(k, DType::I64));
                        im.take(v, 0, i)
                    };
                    (pick(0)?, pick(1)?)
                }
            };
            call(
                Op::OneHot {
                    depth,
                    axis: a.int("axis", -1),
                },
                vec![i, on, off],
            )
        }
        "Range" => {
            let name = |i| req(node, i);
            let dtype = match im.val(name(0)?)? {
                Val::Const(c) => c.dtype,
                Val::Ints(i) => i.dtype,
                Val::Expr(_) => {
                    return Err(invalid(
                        "Range with bounds computed at run time is not supported (its shape \
                         would depend on data)",
                    ));
                }
            };
            if let Some(outs) = symbolic_range(im, node, dtype)? {
                return Ok(Some(outs));
            }
            let mut v = [0.0; 3];
            for (k, slot) in v.iter_mut().enumerate() {
                let what = ["start", "limit", "delta"][k];
                let vals = im.const_f64s(name(k)?).map_err(|_| {
                    invalid(format!(
                        "Range's `{what}` must be known at import time (a dynamic bound gives a \
                         data-dependent shape)"
                    ))
                })?;
                *slot = match vals.as_slice() {
                    [x] => *x,
                    _ => return Err(invalid(format!("`{what}` must be a scalar"))),
                };
            }
            let attrs = ArangeAttrs {
                start: F64(v[0]),
                end: F64(v[1]),
                step: F64(v[2]),
                dtype,
            };
            let n = attrs.numel().map_err(invalid)?;
            if dtype.is_int() && n <= MAX_FOLDED_RANGE {
                // A small integer range (reduce axes, say) folds to a constant, as the
                // importer folds other integer shape arithmetic.
                let (s, st) = (v[0] as i64, v[2] as i64);
                let vals: Vec<i64> = (0..n).map(|i| s.wrapping_add(i.wrapping_mul(st))).collect();
                let c = crate::runtime::Tensor::new(
                    vec![vals.len()],
                    crate::runtime::Storage::from_i64(dtype, vals),
                )
                .and_then(|t| t.to_constant())
                .map_err(|e| invalid(e.to_string()))?;
                return Ok(Some(vec![Out::Val(Val::Const(c))]));
            }
            call(Op::Arange(Box::new(attrs)), vec![])
        }
        "Tile" => {
            let x = im.expr(req(node, 0)?)?;
            let (dims, _) = im.dims(x)?;
            let reps = im.const_dims(req(node, 1)?)?;
            if reps.iter().any(|r| r.as_static().is_none()) && reps.len() == dims.len() {
                return tile_symbolic(im, x, &dims, &reps)
                    .map(|v| Some(vec![Out::Val(Val::Expr(v))]));
            }
            let repeats = im.const_i64s(req(node, 1)?)?;
            // ONNX wants one repeat per axis (relax.tile would pad a short list, numpy-style).
            if repeats.len() != dims.len() {
                return Err(invalid(format!(
                    "`repeats` {repeats:?} has {} values; expected one per axis of the rank-{} \
                     input",
                    repeats.len(),
                    dims.len()
                )));
            }
            if let Some(r) = repeats.iter().find(|r| **r < 0) {
                return Err(invalid(format!(
                    "`repeats` {repeats:?} holds the negative repeat {r}; expected repeats ≥ 0"
                )));
            }
            call(Op::Tile { repeats }, vec![x])
        }
        "Trilu" => {
            let x = im.expr(req(node, 0)?)?;
            let k = match input(node, 1) {
                Some(n) => const_int(im, n, "k")?,
                None => 0,
            };
            let o = if a.int("upper", 1) != 0 {
                Op::Triu { k }
            } else {
                Op::Tril { k }
            };
            call(o, vec![x])
        }
        "CumSum" | "CumProd" => {
            let mut x = im.expr(req(node, 0)?)?;
            let (dims, _) = im.dims(x)?;
            let ax = normalize_axis(const_int(im, req(node, 1)?, "axis")?, dims.len())?;
            let reverse = a.int("reverse", 0) != 0;
            let attrs = Box::new(ScanAttrs {
                axis: Some(ax as i64),
                dtype: None,
                exclusive: a.int("exclusive", 0) != 0,
            });
            let o = if op == "CumSum" {
                Op::Cumsum(attrs)
            } else {
                Op::Cumprod(attrs)
            };
            if !reverse {
                return Ok(Some(call(o, vec![x])));
            }
            x = flip(im, x, ax)?;
            let y = im.emit(o, vec![x])?;
            let (dims, _) = im.dims(y)?;
            let n = dims.get(ax).and_then(Dim::as_static).unwrap_or(0);
            call(
                Op::StridedSlice(Box::new(StridedSliceAttrs {
                    axes: vec![ax as i64],
                    begin: vec![-1],
                    end: vec![-n - 1],
                    strides: Some(vec![-1]),
                    assume_inbound: false,
                })),
                vec![y],
            )
        }
        "Pad" => pad(im, node, &a)?,
        "Size" => {
            let x = req(node, 0)?;
            let dims: Vec<Dim> = match im.val(x)? {
                Val::Const(c) => c.shape.iter().map(|&d| Dim::Static(d)).collect(),
                Val::Ints(i) => i.shape.iter().map(|&d| Dim::Static(d as i64)).collect(),
                Val::Expr(e) => im.dims(e)?.0,
            };
            let n = dims.iter().fold(Dim::Static(1), |acc, d| acc.mul(d));
            match n.as_static() {
                Some(n) => vec![Out::Val(Val::Const(Constant::scalar_i64(n, DType::I64)))],
                // A symbolic count stays a folded shape value (a tensor only where data
                // needs it: `R.shape_to_tensor`).
                None => vec![Out::Val(Val::Ints(super::super::fold::Ints {
                    dtype: DType::I64,
                    shape: vec![],
                    vals: vec![n],
                }))],
            }
        }
        "DepthToSpace" | "SpaceToDepth" => depth_space(im, node, &a)?,
        "TensorScatter" => tensor_scatter(im, node, &a)?,
        "CenterCropPad" => {
            // One pad whose negative widths crop: centered, the odd element after.
            let x = im.expr(req(node, 0)?)?;
            let (dims, _) = im.dims(x)?;
            let r = dims.len();
            let shape = im.const_i64s(req(node, 1)?)?;
            let axes: Vec<usize> = match a.ints("axes") {
                Some(ax) => ax
                    .iter()
                    .map(|&v| normalize_axis(v, r))
                    .collect::<Result<_>>()?,
                None => (0..r).collect(),
            };
            if shape.len() != axes.len() {
                return Err(invalid(format!(
                    "`shape` has {} values for {} axes",
                    shape.len(),
                    axes.len()
                )));
            }
            let mut width = vec![0i64; 2 * r];
            for (&ax, &t) in axes.iter().zip(&shape) {
                let n = dims[ax].as_static().ok_or_else(|| {
                    invalid(format!("CenterCropPad needs a static extent on axis {ax}"))
                })?;
                if t < 0 {
                    return Err(invalid(format!("negative target extent {t}")));
                }
                let diff = t - n;
                let (before, after) = if diff >= 0 {
                    (diff / 2, diff - diff / 2)
                } else {
                    let d = -diff;
                    (-(d / 2), -(d - d / 2))
                };
                width[2 * ax] = before;
                width[2 * ax + 1] = after;
            }
            call(
                Op::Pad(Box::new(PadAttrs {
                    pad_width: width,
                    pad_value: F64(0.0),
                    pad_mode: PadMode::Constant,
                })),
                vec![x],
            )
        }
        _ => return Ok(None),
    }))
}

/// `Range(start, limit, delta)` over integers whose `limit` or `start` is a symbolic dim
/// (position ids of a dynamic sequence length; XLNet's relative positions `Range(n, -n, -1)`):
/// `start + delta * cumsum(broadcast_to(1, [n]), exclusive)` with
/// `n = ceil((limit - start) / delta)` as a dim expression (ONNX's `max(n, 0)` holds where it
/// is not negative: a negative extent is a run-time error). `None` when every bound is static.
fn symbolic_range(
    im: &mut Importer<'_>,
    node: &super::super::NodeProto,
    dtype: DType,
) -> Result<Option<Vec<Out>>> {
    let mut b = Vec::with_capacity(3);
    for k in 0..3 {
        match im.const_dims(req(node, k)?) {
            Ok(d) if d.len() == 1 => b.push(d[0].clone()),
            _ => return Ok(None),
        }
    }
    let [start, limit, delta] = [&b[0], &b[1], &b[2]];
    if limit.as_static().is_some() && start.as_static().is_some() {
        return Ok(None);
    }
    let (Some(d), true) = (delta.as_static(), dtype.is_int()) else {
        return Err(invalid(format!(
            "Range({start}, {limit}, {delta}): symbolic bounds need a static integer delta"
        )));
    };
    if d == 0 {
        return Err(invalid("Range's delta must not be 0"));
    }
    let n = if d > 0 {
        limit
            .sub(start)
            .add(&Dim::Static(d - 1))
            .floor_div(&Dim::Static(d))
    } else {
        start
            .sub(limit)
            .add(&Dim::Static(-d - 1))
            .floor_div(&Dim::Static(-d))
    };
    let one = im.b.constant(Constant::scalar_i64(1, dtype));
    let shape = im.b.shape(vec![n]);
    let ones = im.emit(Op::BroadcastTo, vec![one, shape])?;
    let scan = Op::Cumsum(Box::new(ScanAttrs {
        axis: Some(0),
        dtype: None,
        exclusive: true,
    }));
    let s = start.as_static();
    if d == 1 && s == Some(0) {
        return Ok(Some(call(scan, vec![ones])));
    }
    let mut y = im.emit(scan, vec![ones])?;
    if d != 1 {
        let dc = im.b.constant(Constant::scalar_i64(d, dtype));
        if s == Some(0) {
            return Ok(Some(call(Op::Multiply, vec![y, dc])));
        }
        y = im.emit(Op::Multiply, vec![y, dc])?;
    }
    // A symbolic start (XLNet's `Range(n, -n, -1)`) is read back at run time.
    let sc = match s {
        Some(s) => im.b.constant(Constant::scalar_i64(s, dtype)),
        None => im.expr(req(node, 0)?)?,
    };
    Ok(Some(call(Op::Add, vec![y, sc])))
}

/// `TensorScatter` (a KV-cache write, opset 24): `update` goes into `past_cache` along `axis`
/// at `write_indices[b] + i` for batch `b` (modulo the cache length in `circular` mode), as
/// one `scatter_elements` over indices built with `arange`, `add` and `broadcast_to` (and a
/// wrapping `take` for `circular`).
fn tensor_scatter(
    im: &mut Importer<'_>,
    node: &super::super::NodeProto,
    a: &Attrs<'_>,
) -> Result<Vec<Out>> {
    let past = im.expr(req(node, 0)?)?;
    let upd = im.expr(req(node, 1)?)?;
    let (pd, _) = im.dims(past)?;
    let (ud, _) = im.dims(upd)?;
    let r = pd.len();
    if ud.len() != r || r < 2 {
        return Err(invalid(format!(
            "expected past_cache and update of one rank (at least 2), found {} and {}",
            r,
            ud.len()
        )));
    }
    let axis = normalize_axis(a.int("axis", -2), r)?;
    if axis == 0 {
        return Err(invalid("axis must not be the batch axis 0"));
    }
    let circular = match a.string("mode", "linear").as_str() {
        "linear" => false,
        "circular" => true,
        other => return Err(invalid(format!("unknown mode `{other}`"))),
    };
    let s = ud[axis]
        .as_static()
        .ok_or_else(|| invalid("TensorScatter needs a static update length"))?;
    let ar = |n: i64| {
        Op::Arange(Box::new(ArangeAttrs {
            start: F64(0.0),
            end: F64(n as f64),
            step: F64(1.0),
            dtype: DType::I64,
        }))
    };
    let steps = im.emit(ar(s), vec![])?;
    // pos: [batch, s] (or [1, s] without write_indices).
    let pos = match input(node, 2) {
        Some(w) => {
            let w = im.expr(w)?;
            let w = int_index(im, w)?;
            let sh = im.b.shape(vec![ud[0].clone(), Dim::Static(1)]);
            let w2 = im.emit(Op::Reshape, vec![w, sh])?;
            im.emit(Op::Add, vec![w2, steps])?
        }
        None => {
            let sh = im.b.shape(vec![Dim::Static(1), Dim::Static(s)]);
            im.emit(Op::Reshape, vec![steps, sh])?
        }
    };
    let pos = if circular {
        let n = pd[axis]
            .as_static()
            .ok_or_else(|| invalid("circular mode needs a static cache length"))?;
        let all = im.emit(ar(n), vec![])?;
        im.emit(
            Op::Take {
                axis: Some(0),
                mode: TakeMode::Wrap,
            },
            vec![all, pos],
        )?
    } else {
        pos
    };
    let (posd, _) = im.dims(pos)?;
    let mut shape = vec![Dim::Static(1); r];
    shape[0] = posd[0].clone();
    shape[axis] = Dim::Static(s);
    let sh = im.b.shape(shape);
    let pos = im.emit(Op::Reshape, vec![pos, sh])?;
    let full = im.b.shape(ud);
    let idx = im.emit(Op::BroadcastTo, vec![pos, full])?;
    Ok(call(
        Op::ScatterElements {
            axis: axis as i64,
            reduction: ScatterReduction::Update,
        },
        vec![past, idx, upd],
    ))
}

fn pad(im: &mut Importer<'_>, node: &super::super::NodeProto, a: &Attrs<'_>) -> Result<Vec<Out>> {
    let x = im.expr(req(node, 0)?)?;
    let (dims, _) = im.dims(x)?;
    let r = dims.len();
    let (pads, value, axes) = if im.opset >= 11 {
        let pads = im.const_dims(req(node, 1)?)?;
        let value = match input(node, 2) {
            Some(n) => match im.const_f64s(n)?.as_slice() {
                [] => 0.0,
                [v] => *v,
                v => {
                    return Err(invalid(format!(
                        "`constant_value` must be a scalar, found {} values",
                        v.len()
                    )));
                }
            },
            None => 0.0,
        };
        let axes = match input(node, 3) {
            Some(n) => Some(im.const_i64s(n)?),
            None => None,
        };
        (pads, value, axes)
    } else {
        (
            a.ints("pads")
                .unwrap_or_default()
                .into_iter()
                .map(Dim::Static)
                .collect(),
            a.float("value", 0.0),
            None,
        )
    };
    let axes: Vec<usize> = match axes {
        Some(ax) => ax
            .iter()
            .map(|&v| normalize_axis(v, r))
            .collect::<Result<_>>()?,
        None => (0..r).collect(),
    };
    if pads.len() != 2 * axes.len() {
        return Err(invalid(format!(
            "expected {} pads (begin and end for {} axes), found {}",
            2 * axes.len(),
            axes.len(),
            pads.len()
        )));
    }
    let mut width = vec![0i64; 2 * r];
    // Symbolic widths (`(-n) % block`, F.pad to a multiple of a block): (axis, before, after).
    let mut symbolic: Vec<(usize, Dim, Dim)> = Vec::new();
    for (k, &ax) in axes.iter().enumerate() {
        let (b, e) = (&pads[k], &pads[k + axes.len()]);
        match (b.as_static(), e.as_static()) {
            (Some(b), Some(e)) => {
                width[2 * ax] = b;
                width[2 * ax + 1] = e;
            }
            _ => symbolic.push((ax, b.clone(), e.clone())),
        }
    }
    let mode = a.string("mode", "constant");
    let pad_mode = match mode.as_str() {
        "constant" => PadMode::Constant,
        "reflect" => PadMode::Reflect,
        "edge" => PadMode::Replicate,
        "wrap" => PadMode::Circular,
        other => return Err(invalid(format!("unknown Pad mode `{other}`"))),
    };
    if !symbolic.is_empty() {
        return pad_symbolic(im, x, width, symbolic, value, pad_mode);
    }
    Ok(call(
        Op::Pad(Box::new(PadAttrs {
            pad_width: width,
            pad_value: F64(value),
            pad_mode,
        })),
        vec![x],
    ))
}

/// A constant `Pad` whose widths on some axes are symbolic: the static widths as one
/// `nn.pad`, then each symbolic axis as a concat with blocks of the pad value
/// (`broadcast_to(value, shape with that axis = width)`). A width that turns out negative at
/// run time is a typed shape error there (ONNX crops on negative pads; this path does not).
///
/// ```text
/// Pad(x: (b, n, 8), pads=[0, 0, 0, 0, (0 - n) % 5, 0])  ->
///     lv = R.broadcast_to(R.const(0, "float32"), R.shape([b, (0 - n) % 5, 8]))
///     y  = R.concat((x, lv), axis=1)                     # (b, n + (0 - n) % 5, 8)
/// ```
fn pad_symbolic(
    im: &mut Importer<'_>,
    x: ExprId,
    width: Vec<i64>,
    symbolic: Vec<(usize, Dim, Dim)>,
    value: f64,
    mode: PadMode,
) -> Result<Vec<Out>> {
    if mode != PadMode::Constant {
        return Err(invalid(
            "Pad with symbolic pads is supported in `constant` mode only",
        ));
    }
    let mut y = x;
    if width.iter().any(|&w| w != 0) {
        y = im.emit(
            Op::Pad(Box::new(PadAttrs {
                pad_width: width,
                pad_value: F64(value),
                pad_mode: mode,
            })),
            vec![y],
        )?;
    }
    for (ax, before, after) in symbolic {
        let (dims, dt) = im.dims(y)?;
        let mut parts = Vec::with_capacity(3);
        for (w, first) in [(before, true), (after, false)] {
            if w == Dim::Static(0) {
                continue;
            }
            if w.as_static().is_some_and(|v| v < 0) {
                return Err(invalid(format!(
                    "Pad with symbolic pads needs non-negative pads, found {w} on axis {ax}"
                )));
            }
            let mut shape = dims.clone();
            shape[ax] = w;
            let v = im.scalar(value, dt);
            let s = im.b.shape(shape);
            let block = im.emit(Op::BroadcastTo, vec![v, s])?;
            if first {
                parts.push(block);
                parts.push(y);
            } else {
                if parts.is_empty() {
                    parts.push(y);
                }
                parts.push(block);
            }
        }
        if parts.is_empty() {
            continue;
        }
        let t = im.b.tuple(parts)?;
        y = im.emit(
            Op::Concat {
                axis: Some(ax as i64),
            },
            vec![t],
        )?;
    }
    Ok(vec![Out::Val(Val::Expr(y))])
}

/// DepthToSpace (DCR or CRD) and SpaceToDepth as reshape → permute → reshape.
fn depth_space(
    im: &mut Importer<'_>,
    node: &super::super::NodeProto,
    a: &Attrs<'_>,
) -> Result<Vec<Out>> {
    let x = im.expr(req(node, 0)?)?;
    let (dims, _) = im.dims(x)?;
    let [n, c, h, w] = dims.as_slice() else {
        return Err(invalid(format!(
            "expected a 4-D NCHW input, found rank {}",
            dims.len()
        )));
    };
    let bs = a.int("blocksize", 0);
    if bs < 1 {
        return Err(invalid(format!("blocksize must be at least 1, found {bs}")));
    }
    let b = Dim::Static(bs);
    let (mid, perm, out) = if node.op_type == "DepthToSpace" {
        let cc = match c.as_static() {
            Some(cv) if cv % (bs * bs) == 0 => Dim::Static(cv / (bs * bs)),
            Some(cv) => {
                return Err(invalid(format!(
                    "channels {cv} are not a multiple of blocksize² = {}",
                    bs * bs
                )));
            }
            None => c.floor_div(&Dim::Static(bs * bs)),
        };
        let out = vec![n.clone(), cc.clone(), h.mul(&b), w.mul(&b)];
        if a.string("mode", "DCR") == "CRD" {
            (
                vec![n.clone(), cc, b.clone(), b, h.clone(), w.clone()],
                vec![0, 1, 4, 2, 5, 3],
                out,
            )
        } else {
            (
                vec![n.clone(), b.clone(), b, cc, h.clone(), w.clone()],
                vec![0, 3, 4, 1, 5, 2],
                out,
            )
        }
    } else {
        let hh = match h.as_static() {
            Some(v) if v % bs == 0 => Dim::Static(v / bs),
            Some(v) => {
                return Err(invalid(format!(
                    "height {v} is not a multiple of blocksize {bs}"
                )));
            }
            None => h.floor_div(&b),
        };
        let ww = match w.as_static() {
            Some(v) if v % bs == 0 => Dim::Static(v / bs),
            Some(v) => {
                return Err(invalid(format!(
                    "width {v} is not a multiple of blocksize {bs}"
                )));
            }
            None => w.floor_div(&b),
        };
        // DCR (the default) puts the block offsets before the channel, CRD after it.
        let perm = if a.string("mode", "DCR") == "CRD" {
            vec![0, 1, 3, 5, 2, 4]
        } else {
            vec![0, 3, 5, 1, 2, 4]
        };
        (
            vec![
                n.clone(),
                c.clone(),
                hh.clone(),
                b.clone(),
                ww.clone(),
                b.clone(),
            ],
            perm,
            vec![n.clone(), c.mul(&Dim::Static(bs * bs)), hh, ww],
        )
    };
    let s = im.b.shape(mid);
    let r = im.emit(Op::Reshape, vec![x, s])?;
    let p = im.emit(Op::PermuteDims { axes: Some(perm) }, vec![r])?;
    let s2 = im.b.shape(out);
    Ok(call(Op::Reshape, vec![p, s2]))
}

/// `Tile` whose repeats hold symbolic dims (DeBERTa-v2 tiles its relative-position keys
/// `batch · heads` times): relax.tile's repeats are static, so the static repeats tile first and
/// each symbolic repeat `r` of an axis of extent `d` becomes a new axis of extent `r` before it,
/// broadcast to and merged by one reshape into `r · d`.
///
/// ```text
/// y = Tile(x: (1, 64, 16), repeats = [b * 2, 1, 1])
/// → t = R.broadcast_to(R.reshape(x, (1, 1, 64, 16)), (b * 2, 1, 64, 16))
///   y = R.reshape(t, (b * 2, 64, 16))
/// ```
fn tile_symbolic(im: &mut Importer<'_>, x: ExprId, dims: &[Dim], reps: &[Dim]) -> Result<ExprId> {
    if let Some(r) = reps.iter().find(|r| r.as_static().is_some_and(|v| v < 0)) {
        return Err(invalid(format!(
            "`repeats` holds the negative repeat {r}; expected repeats ≥ 0"
        )));
    }
    let statics: Vec<i64> = reps.iter().map(|r| r.as_static().unwrap_or(1)).collect();
    let x = if statics.iter().all(|&r| r == 1) {
        x
    } else {
        im.emit(
            Op::Tile {
                repeats: statics.clone(),
            },
            vec![x],
        )?
    };
    let tiled: Vec<Dim> = dims
        .iter()
        .zip(&statics)
        .map(|(d, &r)| d.mul(&Dim::Static(r)))
        .collect();
    let (mut split, mut wide, mut merged) = (Vec::new(), Vec::new(), Vec::new());
    for (d, r) in tiled.iter().zip(reps) {
        if r.as_static().is_none() {
            split.push(Dim::Static(1));
            wide.push(r.clone());
        }
        split.push(d.clone());
        wide.push(d.clone());
        merged.push(match r.as_static() {
            Some(_) => d.clone(),
            None => r.mul(d),
        });
    }
    let s = im.b.shape(split);
    let x = im.emit(Op::Reshape, vec![x, s])?;
    let w = im.b.shape(wide);
    let x = im.emit(Op::BroadcastTo, vec![x, w])?;
    let m = im.b.shape(merged);
    im.emit(Op::Reshape, vec![x, m])
}
