//! ONNX's 3-D convolutions (`Conv` and `ConvTranspose` of 5-D tensors, and through them
//! `ConvInteger`, `QLinearConv` and 3-D `Col2Im`) on the op set's 2-D convolutions, over the
//! depth slices, so every backend that runs `conv2d` runs them.
//!
//! Contract:
//!
//! - `Conv` (input `(N, C, D, H, W)`, weight `(O, C/g, kd, kh, kw)`): the depth axis is padded
//!   (`relax.nn.pad`), the `kd` depth slices `od·sd + k·dd` of every output depth `od` are
//!   gathered by one `relax.take` with a constant `(OD, kd)` index and moved beside the
//!   channels, so one `conv2d` over `(N·OD, C·kd, H, W)` with the weight reshaped to
//!   `(O, C/g·kd, kh, kw)` computes every output depth. A group's channels stay contiguous
//!   (`(c, k)`, `c` major), so `groups` carries over unchanged.
//! - `ConvTranspose` (weight `(C, O/g, kd, kh, kw)`): one `conv2d_transpose` over
//!   `(N·D, C, H, W)` with the weight reshaped to `(C, O/g·kd, kh, kw)` gives each input
//!   depth's contribution per depth tap; tap `k` of input depth `d` lands on output depth
//!   `d·sd + k·dd − pad_begin`. Each tap's slice is spread by `sd` (`sd − 1` zeros after each
//!   depth, a pad and a reshape), shifted and cropped into place by one `relax.nn.pad`, and
//!   the taps are added.
//! - The depth extent must be static (the index and pads are constants); batch, height and
//!   width may be symbolic. The sums are ONNX's terms in another order (and, for the
//!   transposed convolution, plus zeros).
//!
//! ```text
//! Y = Conv(X: f32[1, 2, 5, 6, 6], W: f32[4, 2, 3, 3, 3]; pads=[1, 1, 1, 1, 1, 1])
//!   → lv = R.nn.pad(X, pad_width=[0, 0, 0, 0, 1, 1, 0, 0, 0, 0])     # (1, 2, 7, 6, 6)
//!     lv1 = R.take(lv, I, axis=2)                    # I: (5, 3), I[o, k] = o + k; (1, 2, 5, 3, 6, 6)
//!     lv2 = R.permute_dims(lv1, axes=[0, 2, 1, 3, 4, 5])                # (1, 5, 2, 3, 6, 6)
//!     lv3 = R.nn.conv2d(R.reshape(lv2, R.shape([5, 6, 6, 6])),
//!                       R.reshape(W, R.shape([4, 6, 3, 3])), padding=[1, 1, 1, 1])
//!     Y = R.permute_dims(R.reshape(lv3, R.shape([1, 5, 4, 6, 6])), axes=[0, 2, 1, 3, 4])
//! Y = ConvTranspose(X: f32[1, 1, 3, 4, 5], W: f32[1, 2, 3, 3, 3])
//!   → lv = R.reshape(R.permute_dims(X, axes=[0, 2, 1, 3, 4]), R.shape([3, 1, 4, 5]))
//!     lv1 = R.nn.conv2d_transpose(lv, R.reshape(W, R.shape([1, 6, 3, 3])))  # (3, 6, 6, 7)
//!     lv2 = R.permute_dims(R.reshape(lv1, R.shape([1, 3, 2, 3, 6, 7])), axes=[0, 3, 1, 2, 4, 5])
//!     t_k = R.nn.pad(R.reshape(R.strided_slice(lv2, axes=[1], begin=[k], end=[k + 1]),
//!                              R.shape([1, 3, 2, 6, 7])), pad_width=[.., k, 2 - k, ..])
//!     Y = R.permute_dims(t_0 + t_1 + t_2, axes=[0, 2, 1, 3, 4])         # (1, 2, 5, 6, 7)
//! ```

use super::super::{Attrs, Importer, Out, Val, invalid};
use super::nn::TransposeGeometry;
use super::{call, window};
use crate::error::Result;
use crate::ir::{Constant, DType, Dim, ExprId};
use crate::op::{
    Conv2dAttrs, Conv2dTransposeAttrs, F64, Op, PadAttrs, PadMode, StridedSliceAttrs, TakeMode,
};

/// The most entries of the depth index `Conv` gathers with (`OD · kd`).
const MAX_INDEX: i64 = 1 << 24;

/// The most depth taps of a transposed convolution (each adds a few bindings).
const MAX_TAPS: i64 = 256;

/// The longest depth a transposed convolution computes before its pads are cropped.
const MAX_DEPTH: i64 = 1 << 24;

fn static_depth(d: &Dim, what: &str) -> Result<i64> {
    d.as_static().ok_or_else(|| {
        invalid(format!(
            "a 3-D {what} needs a static depth extent, found {d}"
        ))
    })
}

/// `x` padded with zeros by `before` / `after` along `axis` of its `rank` (negative values
/// crop); `x` itself when both are 0.
fn pad_axis(
    im: &mut Importer<'_>,
    x: ExprId,
    rank: usize,
    axis: usize,
    before: i64,
    after: i64,
) -> Result<ExprId> {
    if before == 0 && after == 0 {
        return Ok(x);
    }
    let mut pad_width = vec![0; 2 * rank];
    pad_width[2 * axis] = before;
    pad_width[2 * axis + 1] = after;
    im.emit(
        Op::Pad(Box::new(PadAttrs {
            pad_width,
            pad_value: F64(0.0),
            pad_mode: PadMode::Constant,
        })),
        vec![x],
    )
}

fn reshape(im: &mut Importer<'_>, x: ExprId, dims: Vec<Dim>) -> Result<ExprId> {
    let s = im.b.shape(dims);
    im.emit(Op::Reshape, vec![x, s])
}

/// A 5-D weight `(O, I, kd, kh, kw)` as the 2-D one `(O, I·kd, kh, kw)`: each depth tap one more
/// input channel (Conv's `I` and ConvTranspose's `O/g` alike).
fn depth_into_channels(im: &mut Importer<'_>, w: ExprId, wd: &[Dim], kd: &Dim) -> Result<ExprId> {
    reshape(
        im,
        w,
        vec![wd[0].clone(), wd[1].mul(kd), wd[3].clone(), wd[4].clone()],
    )
}

fn permute(im: &mut Importer<'_>, x: ExprId, axes: &[i64]) -> Result<ExprId> {
    im.emit(
        Op::PermuteDims {
            axes: Some(axes.to_vec()),
        },
        vec![x],
    )
}

/// `y + bias` with a 1-D bias broadcast along axis 1 of the 5-D `y`; `y` without one.
pub(super) fn add_bias(im: &mut Importer<'_>, y: ExprId, bias: Option<ExprId>) -> Result<Vec<Out>> {
    let Some(b) = bias else {
        return Ok(vec![Out::Val(Val::Expr(y))]);
    };
    let (bd, _) = im.dims(b)?;
    let [m] = bd.as_slice() else {
        return Err(invalid(format!(
            "a convolution's bias must be 1-D, found rank {}",
            bd.len()
        )));
    };
    let one = Dim::Static(1);
    let br = reshape(
        im,
        b,
        vec![one.clone(), m.clone(), one.clone(), one.clone(), one],
    )?;
    Ok(call(Op::Add, vec![y, br]))
}

/// `Conv(x, w[, bias])` of a 5-D input and weight (see the module doc); `a` holds `Conv`'s
/// attributes.
pub(super) fn conv3d(
    im: &mut Importer<'_>,
    x: ExprId,
    w: ExprId,
    bias: Option<&str>,
    a: &Attrs<'_>,
) -> Result<Vec<Out>> {
    let (xd, _) = im.dims(x)?;
    let (wd, _) = im.dims(w)?;
    let kernel = match a.ints("kernel_shape") {
        Some(k) => k,
        None => wd[2..]
            .iter()
            .map(|d| {
                d.as_static()
                    .ok_or_else(|| invalid("a 3-D Conv needs a static kernel or `kernel_shape`"))
            })
            .collect::<Result<_>>()?,
    };
    let win = window(a, &xd, &kernel)?;
    let group = a.int("group", 1);
    let bad = kernel
        .iter()
        .chain(&win.strides)
        .chain(&win.dilations)
        .any(|&v| v < 1)
        || win.pads.iter().any(|&p| p < 0)
        || group < 1;
    if bad {
        return Err(invalid(format!(
            "Conv needs kernel, strides, dilations and group ≥ 1 and pads ≥ 0, found kernel \
             {kernel:?}, strides {:?}, dilations {:?}, pads {:?}, group {group}",
            win.strides, win.dilations, win.pads
        )));
    }
    let depth = static_depth(&xd[2], "Conv")?;
    let (kd, sd, dd) = (kernel[0], win.strides[0], win.dilations[0]);
    let (pd0, pd1) = (win.pads[0], win.pads[3]);
    let padded = depth.saturating_add(pd0).saturating_add(pd1);
    let span = (kd - 1).saturating_mul(dd).saturating_add(1);
    if padded < span {
        return Err(invalid(format!(
            "Conv: the kernel's depth span {span} exceeds the padded input depth {padded}"
        )));
    }
    let od = (padded - span) / sd + 1;
    if od.saturating_mul(kd) > MAX_INDEX {
        return Err(invalid(format!(
            "a 3-D Conv of {od} output depths × {kd} taps exceeds the {MAX_INDEX} depth \
             slices fusebox gathers"
        )));
    }
    let xp = pad_axis(im, x, 5, 2, pd0, pd1)?;
    // (N, C, OD, kd, H, W): the depth slices each output depth reads.
    let index: Vec<u8> = (0..od)
        .flat_map(|o| (0..kd).map(move |k| o * sd + k * dd))
        .flat_map(i64::to_le_bytes)
        .collect();
    let index = Constant::from_bytes(DType::I64, vec![od, kd], index).map_err(invalid)?;
    let index = im.b.constant(index);
    let t = im.emit(
        Op::Take {
            axis: Some(2),
            mode: TakeMode::Fast,
        },
        vec![xp, index],
    )?;
    let t = permute(im, t, &[0, 2, 1, 3, 4, 5])?;
    let (n, c, h, wx) = (&xd[0], &xd[1], &xd[3], &xd[4]);
    let odim = Dim::Static(od);
    let kdim = Dim::Static(kd);
    let x2 = reshape(
        im,
        t,
        vec![n.mul(&odim), c.mul(&kdim), h.clone(), wx.clone()],
    )?;
    let w2 = depth_into_channels(im, w, &wd, &kdim)?;
    let y = im.emit(
        Op::Conv2d(Box::new(Conv2dAttrs {
            strides: [win.strides[1], win.strides[2]],
            padding: [win.pads[1], win.pads[2], win.pads[4], win.pads[5]],
            dilation: [win.dilations[1], win.dilations[2]],
            groups: group,
            data_layout: "NCHW".into(),
            kernel_layout: "OIHW".into(),
            out_layout: "NCHW".into(),
            out_dtype: None,
        })),
        vec![x2, w2],
    )?;
    let (yd, _) = im.dims(y)?;
    let y = reshape(
        im,
        y,
        vec![n.clone(), odim, yd[1].clone(), yd[2].clone(), yd[3].clone()],
    )?;
    let y = permute(im, y, &[0, 2, 1, 3, 4])?;
    let bias = bias.map(|b| im.expr(b)).transpose()?;
    add_bias(im, y, bias)
}

/// `ConvTranspose(x, w)` of a 5-D input and weight, without the bias (see the module doc).
pub(super) fn conv_transpose3d(
    im: &mut Importer<'_>,
    x: ExprId,
    w: ExprId,
    g: &TransposeGeometry,
) -> Result<ExprId> {
    let (xd, _) = im.dims(x)?;
    let (wd, _) = im.dims(w)?;
    let depth = static_depth(&xd[2], "ConvTranspose")?;
    let kd = g.kernel[0];
    // One input depth is never spread, whatever the stride.
    let sd = if depth == 1 { 1 } else { g.strides[0] };
    let dd = g.dilations[0];
    let (pd0, pd1) = (g.pads[0], g.pads[3]);
    // The full output depth before the pads are cropped.
    let full = (depth - 1)
        .saturating_mul(sd)
        .saturating_add(1)
        .saturating_add((kd - 1).saturating_mul(dd))
        .saturating_add(g.output_padding[0]);
    let od = full.saturating_sub(pd0).saturating_sub(pd1);
    if full > MAX_DEPTH {
        return Err(invalid(format!(
            "ConvTranspose: an output depth of {full} before the pads (at most {MAX_DEPTH})"
        )));
    }
    if kd > MAX_TAPS {
        return Err(invalid(format!(
            "a 3-D ConvTranspose with {kd} depth taps (at most {MAX_TAPS} are supported)"
        )));
    }
    if depth < 1 || od < 1 {
        return Err(invalid(format!(
            "ConvTranspose: input depth {depth} gives output depth {od} after pads {pd0} + {pd1}"
        )));
    }
    let (n, c, h, wx) = (&xd[0], &xd[1], &xd[3], &xd[4]);
    let ddim = Dim::Static(depth);
    let kdim = Dim::Static(kd);
    // (N·D, C, H, W) through one 2-D transposed convolution with (o, k) output channels.
    let x2 = permute(im, x, &[0, 2, 1, 3, 4])?;
    let x2 = reshape(im, x2, vec![n.mul(&ddim), c.clone(), h.clone(), wx.clone()])?;
    let w2 = depth_into_channels(im, w, &wd, &kdim)?;
    let y = im.emit(
        Op::Conv2dTranspose(Box::new(Conv2dTransposeAttrs {
            strides: [g.strides[1], g.strides[2]],
            padding: [g.pads[1], g.pads[2], g.pads[4], g.pads[5]],
            output_padding: [g.output_padding[1], g.output_padding[2]],
            dilation: [g.dilations[1], g.dilations[2]],
            groups: g.group,
            data_layout: "NCHW".into(),
            kernel_layout: "IOHW".into(),
            out_layout: "NCHW".into(),
            out_dtype: None,
        })),
        vec![x2, w2],
    )?;
    let (yd, _) = im.dims(y)?;
    let (oh, ow) = (yd[2].clone(), yd[3].clone());
    let o = match (yd[1].as_static(), yd[1].clone()) {
        (Some(ok), _) if ok % kd == 0 => Dim::Static(ok / kd),
        (_, d) => {
            return Err(invalid(format!(
                "ConvTranspose: {d} output channels are not a multiple of the {kd} depth taps"
            )));
        }
    };
    // (N, kd, D, O, OH, OW): tap k's contributions, input depth by input depth.
    let y = reshape(
        im,
        y,
        vec![n.clone(), ddim, o.clone(), kdim, oh.clone(), ow.clone()],
    )?;
    let y = permute(im, y, &[0, 3, 1, 2, 4, 5])?;
    let mut acc: Option<ExprId> = None;
    for k in 0..kd {
        let t = im.emit(
            Op::StridedSlice(Box::new(StridedSliceAttrs {
                axes: vec![1],
                begin: vec![k],
                end: vec![k + 1],
                strides: None,
                assume_inbound: true,
            })),
            vec![y],
        )?;
        // Spread by the stride: input depth d at d·sd, zeros between.
        let t = if sd == 1 {
            reshape(
                im,
                t,
                vec![
                    n.clone(),
                    Dim::Static(depth),
                    o.clone(),
                    oh.clone(),
                    ow.clone(),
                ],
            )?
        } else {
            let t = reshape(
                im,
                t,
                vec![
                    n.clone(),
                    Dim::Static(depth),
                    Dim::Static(1),
                    o.clone(),
                    oh.clone(),
                    ow.clone(),
                ],
            )?;
            let t = pad_axis(im, t, 6, 2, 0, sd - 1)?;
            reshape(
                im,
                t,
                vec![
                    n.clone(),
                    Dim::Static(depth * sd),
                    o.clone(),
                    oh.clone(),
                    ow.clone(),
                ],
            )?
        };
        // Shift to k·dd − pd0 and cut to the output depth: first the zeros, then the crop.
        let len = if sd == 1 { depth } else { depth * sd };
        let before = k * dd - pd0;
        let after = od - before - len;
        let t = pad_axis(im, t, 5, 1, before.max(0), after.max(0))?;
        let t = pad_axis(im, t, 5, 1, before.min(0), after.min(0))?;
        acc = Some(match acc {
            None => t,
            Some(s) => im.emit(Op::Add, vec![s, t])?,
        });
    }
    let acc = acc.ok_or_else(|| invalid("ConvTranspose: a kernel of depth 0"))?;
    permute(im, acc, &[0, 2, 1, 3, 4])
}
