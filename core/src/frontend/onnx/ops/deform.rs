//! ONNX's `DeformConv` (opset 19, 2-D) lowered to ops fusebox has, as ONNX's reference defines
//! it: every kernel tap samples the input bilinearly at its offset position
//! (`relax.image.grid_sample`, `align_corners=True`, zeros outside), the samples are scaled by
//! the mask, and one grouped 1×1 `conv2d` sums them with the weights.
//!
//! Contract:
//!
//! - Per offset group `g` (`C / offset_group` channels), the positions of all `K = kh·kw`
//!   taps at every output pixel, `y = i·sh − pad_top + a·dh + offset_y` and
//!   `x = j·sw − pad_left + b·dw + offset_x`, normalised as the reference does
//!   (`v / (extent − 1) · 2 − 1`), form
//!   one `(N, 2, K·OH, OW)` grid: one `grid_sample` per offset group gives `(N, C/G, K, OH,
//!   OW)`, times the mask's `(N, 1, K, OH, OW)` slice when there is one. Positions, grid and
//!   samples are `float64` (the reference's arithmetic), cast back before the convolution.
//! - The groups' samples, concatenated to `(N, C·K, OH, OW)`, meet the weight reshaped to
//!   `(O, C/group · K, 1, 1)` in a `conv2d` with `groups=group`; the bias is added after.
//! - The output extent is the offset's (checked against the kernel, strides, dilations and
//!   pads); the input must be 4-D with static spatial extents of at least 2 (the reference
//!   divides by `extent − 1`).
//!
//! ```text
//! Y = DeformConv(X: f32[1, 1, 3, 3], W: f32[1, 1, 2, 2], offset: f32[1, 8, 2, 2])
//!   → grid (1, 2, 8, 2) from offset + constant base positions; s = R.image.grid_sample(X, grid,
//!     method="bilinear", padding_mode="zeros", align_corners=True)       # (1, 1, 8, 2)
//!     Y = R.nn.conv2d(R.reshape(s, [1, 4, 2, 2]), R.reshape(W, [1, 4, 1, 1]))
//! ```

use super::super::{Attrs, Importer, NodeProto, Out, Val, dims_str, input, invalid, req};
use crate::error::Result;
use crate::ir::{Constant, Dim, ExprId};
use crate::op::{Conv2dAttrs, GridSampleAttrs, Op, StridedSliceAttrs};

/// The most base positions (taps × output rows, taps × output columns) one `DeformConv`
/// builds at import.
const MAX_TABLE: i64 = 1 << 24;

/// `DeformConv(X, W, offset[, B[, mask]])`.
pub(crate) fn deform_conv(
    im: &mut Importer<'_>,
    node: &NodeProto,
    a: &Attrs<'_>,
) -> Result<Vec<Out>> {
    let x = im.expr(req(node, 0)?)?;
    let w = im.expr(req(node, 1)?)?;
    let off = im.expr(req(node, 2)?)?;
    let (xd, dt) = im.dims(x)?;
    let (wd, _) = im.dims(w)?;
    let (od, _) = im.dims(off)?;
    if xd.len() != 4 || wd.len() != 4 || od.len() != 4 {
        return Err(invalid(format!(
            "DeformConv: only the 2-D form is supported (X, W and offset of rank 4), found ranks \
             {}, {} and {}",
            xd.len(),
            wd.len(),
            od.len()
        )));
    }
    if !dt.is_float() {
        return Err(invalid(format!(
            "DeformConv of {dt} data: expected floating point"
        )));
    }
    let stat = |d: &[Dim], what: &str| -> Result<Vec<i64>> {
        d.iter()
            .map(Dim::as_static)
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| invalid(format!("DeformConv needs a static {what} shape")))
    };
    let xs = stat(&xd[1..], "input")?;
    let ws = stat(&wd, "weight")?;
    let os = stat(&od[1..], "offset")?;
    let n = xd[0].clone();
    let (c, h, wi) = (xs[0], xs[1], xs[2]);
    let (o, cpg, kh, kw) = (ws[0], ws[1], ws[2], ws[3]);
    let (oh, ow) = (os[1], os[2]);
    let pair = |name: &str, default: i64| -> Result<[i64; 2]> {
        match a.ints(name) {
            None => Ok([default; 2]),
            Some(v) if v.len() == 2 => Ok([v[0], v[1]]),
            Some(v) => Err(invalid(format!(
                "DeformConv's {name} must have 2 values, found {v:?}"
            ))),
        }
    };
    let strides = pair("strides", 1)?;
    let dil = pair("dilations", 1)?;
    let pads = match a.ints("pads") {
        None => [0; 4],
        Some(v) if v.len() == 4 => [v[0], v[1], v[2], v[3]],
        Some(v) => {
            return Err(invalid(format!(
                "DeformConv's pads must have 4 values, found {v:?}"
            )));
        }
    };
    if let Some(k) = a.ints("kernel_shape")
        && k != [kh, kw]
    {
        return Err(invalid(format!(
            "DeformConv's kernel_shape {k:?} differs from the weight's {:?}",
            [kh, kw]
        )));
    }
    let group = a.int("group", 1);
    let og = a.int("offset_group", 1);
    let k = kh * kw;
    let bad = strides.iter().chain(&dil).any(|&v| v < 1)
        || pads.iter().any(|&v| v < 0)
        || group < 1
        || og < 1
        || c % group != 0
        || c / group != cpg
        || o % group != 0
        || c % og != 0
        || h < 2
        || wi < 2
        || kh < 1
        || kw < 1;
    if bad {
        return Err(invalid(format!(
            "DeformConv: inconsistent shapes or attributes (X channels {c}, plane {h}×{wi} of \
             at least 2×2, W {ws:?}, group {group}, offset_group {og}, strides {strides:?}, \
             dilations {dil:?}, pads {pads:?})"
        )));
    }
    let expect = |len: i64, i: usize| {
        (len + pads[i] + pads[i + 2] - ((ws[2 + i] - 1) * dil[i] + 1)) / strides[i] + 1
    };
    if os[0] != og * 2 * k || oh != expect(h, 0) || ow != expect(wi, 1) {
        return Err(invalid(format!(
            "DeformConv's offset {} must be (N, {}, {}, {}) for offset_group {og}, the kernel, \
             strides, dilations and pads",
            dims_str(&od),
            og * 2 * k,
            expect(h, 0),
            expect(wi, 1)
        )));
    }
    // The base-position tables hold K·OH and K·OW values, made here: bounded.
    if k.saturating_mul(oh.max(ow)) > MAX_TABLE {
        return Err(invalid(format!(
            "DeformConv's {k} taps × {} output rows or columns exceed {MAX_TABLE} positions",
            oh.max(ow)
        )));
    }
    // Mask (N, G·K, OH, OW), if given.
    let mask = match input(node, 4) {
        Some(m) => {
            let e = im.expr(m)?;
            let (md, _) = im.dims(e)?;
            if md.len() != 4 || md[1].as_static() != Some(og * k) {
                return Err(invalid(format!(
                    "DeformConv's mask must be (N, {}, {oh}, {ow}), found {}",
                    og * k,
                    dims_str(&md)
                )));
            }
            Some(e)
        }
        None => None,
    };
    // The positions, their normalisation and the samples in float64 (the reference's
    // arithmetic): in the input's float32 a position's round trip through the normalised grid
    // moved samples by ~1e-6; the samples are cast back before the convolution.
    let f64t = crate::ir::DType::F64;
    let scalar = |im: &mut Importer<'_>, v: f64| im.scalar(v, f64t);
    let x = if dt == f64t {
        x
    } else {
        im.emit(Op::Astype { dtype: f64t }, vec![x])?
    };
    let off = if dt == f64t {
        off
    } else {
        im.emit(Op::Astype { dtype: f64t }, vec![off])?
    };
    let mask = match mask {
        Some(m) if dt != f64t => Some(im.emit(Op::Astype { dtype: f64t }, vec![m])?),
        m => m,
    };
    let shape = |im: &mut Importer<'_>, d: Vec<i64>| {
        let mut dims = vec![n.clone()];
        dims.extend(d.into_iter().map(Dim::Static));
        im.b.shape(dims)
    };
    let take = |im: &mut Importer<'_>, e: ExprId, i: i64, axis: i64| -> Result<ExprId> {
        let idx =
            im.b.constant(Constant::scalar_i64(i, crate::ir::DType::I64));
        im.take(e, axis, idx)
    };
    // Base positions of tap (a, b) at output (i, j), normalised factors.
    let base = |im: &mut Importer<'_>, along_h: bool| -> Result<ExprId> {
        let (len, d) = if along_h { (oh, 0) } else { (ow, 1) };
        let mut v = Vec::with_capacity((k * len) as usize);
        for a in 0..kh {
            for b in 0..kw {
                let tap = if along_h { a } else { b };
                for i in 0..len {
                    v.push((i * strides[d] - pads[d] + tap * dil[d]) as f64);
                }
            }
        }
        let shape = if along_h {
            vec![k, oh, 1]
        } else {
            vec![k, 1, ow]
        };
        im.f64_const(shape, &v)
    };
    let (base_y, base_x) = (base(im, true)?, base(im, false)?);
    let off_shape = shape(im, vec![og, k, 2, oh, ow]);
    let off6 = im.emit(Op::Reshape, vec![off, off_shape])?;
    let mask5 = match mask {
        Some(m) => {
            let s = shape(im, vec![og, k, oh, ow]);
            Some(im.emit(Op::Reshape, vec![m, s])?)
        }
        None => None,
    };
    let cg = c / og;
    let mut pieces = Vec::with_capacity(og as usize);
    for g in 0..og {
        let og_off = take(im, off6, g, 1)?; // (N, K, 2, OH, OW)
        let mut coords = Vec::with_capacity(2);
        // Channel 0 of the grid is x (width), 1 is y (height).
        for (comp, base, extent) in [(1, base_x, wi), (0, base_y, h)] {
            let o = take(im, og_off, comp, 2)?; // (N, K, OH, OW)
            let p = im.emit(Op::Add, vec![o, base])?;
            let div = scalar(im, (extent - 1) as f64);
            let p = im.emit(Op::Divide, vec![p, div])?;
            let two = scalar(im, 2.0);
            let p = im.emit(Op::Multiply, vec![p, two])?;
            let one = scalar(im, 1.0);
            let p = im.emit(Op::Subtract, vec![p, one])?;
            coords.push(im.emit(Op::ExpandDims { axis: vec![1] }, vec![p])?);
        }
        let both = im.b.tuple(coords)?;
        let grid = im.emit(Op::Concat { axis: Some(1) }, vec![both])?; // (N, 2, K, OH, OW)
        let gs = shape(im, vec![2, k * oh, ow]);
        let grid = im.emit(Op::Reshape, vec![grid, gs])?;
        let data = if og == 1 {
            x
        } else {
            im.emit(
                Op::StridedSlice(Box::new(StridedSliceAttrs {
                    axes: vec![1],
                    begin: vec![g * cg],
                    end: vec![(g + 1) * cg],
                    strides: None,
                    assume_inbound: true,
                })),
                vec![x],
            )?
        };
        let s = im.emit(
            Op::GridSample(Box::new(GridSampleAttrs {
                method: "bilinear".into(),
                layout: "NCHW".into(),
                padding_mode: "zeros".into(),
                align_corners: true,
            })),
            vec![data, grid],
        )?;
        let ss = shape(im, vec![cg, k, oh, ow]);
        let mut s = im.emit(Op::Reshape, vec![s, ss])?;
        if let Some(m) = mask5 {
            let mg = take(im, m, g, 1)?; // (N, K, OH, OW)
            let mg = im.emit(Op::ExpandDims { axis: vec![1] }, vec![mg])?;
            s = im.emit(Op::Multiply, vec![s, mg])?;
        }
        pieces.push(s);
    }
    let cols = if pieces.len() == 1 {
        pieces[0]
    } else {
        let t = im.b.tuple(pieces)?;
        im.emit(Op::Concat { axis: Some(1) }, vec![t])?
    };
    let cs = shape(im, vec![c * k, oh, ow]);
    let mut cols = im.emit(Op::Reshape, vec![cols, cs])?;
    if dt != f64t {
        cols = im.emit(Op::Astype { dtype: dt }, vec![cols])?;
    }
    let wshape = im.b.shape(vec![
        Dim::Static(o),
        Dim::Static(cpg * k),
        Dim::Static(1),
        Dim::Static(1),
    ]);
    let w1 = im.emit(Op::Reshape, vec![w, wshape])?;
    let mut y = im.emit(
        Op::Conv2d(Box::new(Conv2dAttrs {
            strides: [1, 1],
            padding: [0; 4],
            dilation: [1, 1],
            groups: group,
            data_layout: "NCHW".into(),
            kernel_layout: "OIHW".into(),
            out_layout: "NCHW".into(),
            out_dtype: None,
        })),
        vec![cols, w1],
    )?;
    if let Some(bn) = input(node, 3) {
        let b = im.expr(bn)?;
        let bs = im.b.shape(vec![
            Dim::Static(1),
            Dim::Static(o),
            Dim::Static(1),
            Dim::Static(1),
        ]);
        let b = im.emit(Op::Reshape, vec![b, bs])?;
        y = im.emit(Op::Add, vec![y, b])?;
    }
    Ok(vec![Out::Val(Val::Expr(y))])
}
