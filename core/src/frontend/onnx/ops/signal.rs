//! ONNX's signal ops: `DFT` (opsets 17 and 20), `STFT` and `MelWeightMatrix`.
//!
//! Contract:
//!
//! - `DFT` is a dense DFT: the signal axis moved last, then matmuls with constant cosine and
//!   sine matrices (`float64`, the input cast to `float64` and the result back, so a real
//!   input's zero imaginary parts stay zero to rounding as numpy's FFT gives them). Forward
//!   (`onesided`: the first `n/2 + 1` bins), inverse (scaled by `1/n`) and inverse one-sided
//!   (numpy's `irfft`: Hermitian weights, a real `(…, n, 1)` result). `dft_length` pads with
//!   zeros or truncates; it and opset 20's `axis` input must be constants. The matrices hold
//!   at most [`MAX_MATRIX`] values: a longer transform is an error, not an FFT. Over a
//!   symbolic axis (FNet's FFT over the sequence; no `dft_length`, not the inverse one-sided
//!   transform) the matrices are computed at run time from `iota(n)` by the same formula.
//! - `STFT(signal, frame_step[, window, frame_length])`: frames `t·frame_step .. + F` gathered
//!   with one `take` (F = `frame_length`, else the window's length), weighted by the window,
//!   then the DFT above along the frame axis: `(batch, frames, bins, 2)`.
//! - `MelWeightMatrix` with constant inputs is computed at import as ONNX's reference does.
//!
//! ```text
//! y = DFT(x: f32[1, 10, 10, 1]; axis=1, onesided=1)
//!   → lv = R.astype(x, "float64"); lv1 = R.squeeze(lv, axis=[-1]); lv2 = R.permute_dims(lv1, [0, 2, 1])
//!     re = R.matmul(lv2, C) ; im = R.matmul(lv2, -S)     # C, S: (10, 6) float64 constants
//!     y = R.astype(R.permute_dims(R.concat((re[..., None], im[..., None]), -1), [0, 2, 1, 3]), "float32")
//! ```

use super::super::{Attrs, Importer, NodeProto, Out, Val, input, invalid, req};
use crate::error::Result;
use crate::ir::{Constant, DType, Dim, ExprId};
use crate::op::{ElemOp, Op, StridedSliceAttrs};

/// The most values of one DFT matrix (2^24 `float64`s, 128 MiB).
const MAX_MATRIX: usize = 1 << 24;

/// What one transform computes along the last axis.
#[derive(Clone, Copy)]
struct Kind {
    /// The transform length.
    n: usize,
    inverse: bool,
    onesided: bool,
}

impl Kind {
    /// How many input values along the axis take part (the rest is truncated; missing ones
    /// are zeros).
    fn rows(self, len: usize) -> usize {
        let need = if self.inverse && self.onesided {
            self.n / 2 + 1
        } else {
            self.n
        };
        len.min(need)
    }

    /// How many outputs along the axis.
    fn cols(self) -> usize {
        if !self.inverse && self.onesided {
            self.n / 2 + 1
        } else {
            self.n
        }
    }

    /// The matrices `(re, im)` with `y_re = x_re·re + x_im·(-im')…` folded so that
    /// `y_re = x_re·a + x_im·b` and `y_im = x_re·c + x_im·d`: returns `[a, b, c, d]`, each
    /// `rows × cols`, row-major. For the inverse one-sided transform only `a` and `b` count.
    fn matrices(self, rows: usize) -> [Vec<f64>; 4] {
        let (n, cols) = (self.n, self.cols());
        let mut m: [Vec<f64>; 4] = std::array::from_fn(|_| Vec::with_capacity(rows * cols));
        let tau = std::f64::consts::TAU;
        for r in 0..rows {
            for k in 0..cols {
                // The angle's integer part reduced first: cos/sin of 2π·(r·k mod n)/n.
                let th = tau * ((r * k) % n) as f64 / n as f64;
                let (s, c) = th.sin_cos();
                let [a, b, cc, d] = &mut m;
                if self.inverse && self.onesided {
                    // irfft: x[j] = (1/n) Σ_k w_k (X_re[k] cos − X_im[k] sin), w_k = 2 but
                    // for the DC bin and (n even) the Nyquist bin; here r is the bin k.
                    let w = if r == 0 || 2 * r == n { 1.0 } else { 2.0 } / n as f64;
                    a.push(w * c);
                    b.push(-w * s);
                    cc.push(0.0);
                    d.push(0.0);
                } else if self.inverse {
                    let w = 1.0 / n as f64;
                    a.push(w * c);
                    b.push(-w * s);
                    cc.push(w * s);
                    d.push(w * c);
                } else {
                    a.push(c);
                    b.push(s);
                    cc.push(-s);
                    d.push(c);
                }
            }
        }
        m
    }
}

/// The matrices of a transform whose length is the symbolic extent `n` of the signal's axis
/// (no `dft_length`): built at run time from `iota(n)`, the angle `2π·(r·k mod n)/n` as in
/// [`Kind::matrices`]. Forward (both-sided or one-sided: `n // 2 + 1` columns) and inverse
/// both-sided; `[a, b, c, d]` as there.
fn symbolic_matrices(
    im: &mut Importer<'_>,
    n: &Dim,
    inverse: bool,
    onesided: bool,
) -> Result<[ExprId; 4]> {
    let elem = |op| Op::Elem(op);
    let rows = super::dynamic::iota(im, n.clone(), DType::I64)?;
    let cols = if onesided {
        let c = n.floor_div(&Dim::Static(2)).add(&Dim::Static(1));
        super::dynamic::iota(im, c, DType::I64)?
    } else {
        rows
    };
    let col = im.emit(Op::ExpandDims { axis: vec![-1] }, vec![rows])?;
    let rk = im.emit(Op::Multiply, vec![col, cols])?;
    let shape = im.b.shape(vec![n.clone()]);
    let nt = im.emit(Op::ShapeToTensor, vec![shape])?;
    let reduced = im.emit(elem(ElemOp::FloorMod), vec![rk, nt])?;
    let f64s = Op::Astype { dtype: DType::F64 };
    let reduced = im.emit(f64s.clone(), vec![reduced])?;
    let nf = im.emit(f64s, vec![nt])?;
    let tau = im.f64_const(vec![], &[std::f64::consts::TAU])?;
    let th = im.emit(Op::Multiply, vec![reduced, tau])?;
    let th = im.emit(Op::Divide, vec![th, nf])?;
    let mut c = im.emit(elem(ElemOp::Cos), vec![th])?;
    let mut sn = im.emit(elem(ElemOp::Sin), vec![th])?;
    if inverse {
        c = im.emit(Op::Divide, vec![c, nf])?;
        sn = im.emit(Op::Divide, vec![sn, nf])?;
    }
    let neg = im.emit(Op::Negative, vec![sn])?;
    Ok(if inverse {
        [c, neg, sn, c]
    } else {
        [c, sn, neg, c]
    })
}

/// How long a transform is: a static [`Kind`], or the signal axis's symbolic extent.
enum Len {
    Static(Kind),
    Symbolic { inverse: bool, onesided: bool },
}

/// The DFT of `x` (`float64`, its last axis 1 (real) or 2 (real, imaginary)) along `axis`
/// (not the last): a `float64` tensor with that axis transformed and a last axis of 2 (1 for
/// the inverse one-sided transform).
fn dft(im: &mut Importer<'_>, x: ExprId, axis: usize, len_kind: Len) -> Result<ExprId> {
    let (dims, _) = im.dims(x)?;
    let r = dims.len();
    let complex = match dims.last().and_then(Dim::as_static) {
        Some(1) => false,
        Some(2) => true,
        _ => {
            return Err(invalid(format!(
                "the signal's last axis must be 1 (real) or 2 (complex), found shape {dims:?}"
            )));
        }
    };
    if axis + 1 >= r {
        return Err(invalid(format!(
            "the transform axis {axis} must not be the last axis of a rank-{r} signal"
        )));
    }
    let (inverse, onesided) = match &len_kind {
        Len::Static(k) => (k.inverse, k.onesided),
        Len::Symbolic { inverse, onesided } => (*inverse, *onesided),
    };
    // (static length, rows taking part, columns, the transform) or, symbolic, all rows.
    let fixed = match len_kind {
        Len::Static(kind) => {
            let len = dims[axis].as_static().ok_or_else(|| {
                invalid(format!(
                    "the transformed axis must be static, found {}",
                    dims[axis]
                ))
            })? as usize;
            if kind.n == 0 {
                return Err(invalid("the transform length must be at least 1"));
            }
            let rows = kind.rows(len);
            let cols = kind.cols();
            if rows.saturating_mul(cols) > MAX_MATRIX {
                return Err(invalid(format!(
                    "a dense transform of length {} from {rows} values needs a {rows} × {cols} \
                     matrix (at most {MAX_MATRIX} values)",
                    kind.n
                )));
            }
            Some((len, rows, cols, kind))
        }
        Len::Symbolic { .. } => None,
    };

    // Real and imaginary parts, each without the last axis.
    let part = |im: &mut Importer<'_>, i: i64| -> Result<ExprId> {
        let idx = im.b.constant(Constant::scalar_i64(i, DType::I64));
        im.take(x, -1, idx)
    };
    let re = part(im, 0)?;
    let imag = if complex { Some(part(im, 1)?) } else { None };
    // The signal axis last, truncated to the rows that take part.
    let mut perm: Vec<i64> = (0..r as i64 - 1).filter(|&a| a != axis as i64).collect();
    perm.push(axis as i64);
    let last = |im: &mut Importer<'_>, e: ExprId| -> Result<ExprId> {
        let mut e = im.emit(
            Op::PermuteDims {
                axes: Some(perm.clone()),
            },
            vec![e],
        )?;
        if let Some((len, rows, _, _)) = fixed
            && rows < len
        {
            e = im.emit(
                Op::StridedSlice(Box::new(StridedSliceAttrs {
                    axes: vec![-1],
                    begin: vec![0],
                    end: vec![rows as i64],
                    strides: None,
                    assume_inbound: true,
                })),
                vec![e],
            )?;
        }
        Ok(e)
    };
    let re = last(im, re)?;
    let imag = match imag {
        Some(e) => Some(last(im, e)?),
        None => None,
    };
    let [a, b, c, d] = match fixed {
        Some((_, rows, cols, kind)) => {
            let shape = vec![rows as i64, cols as i64];
            let mut m = Vec::with_capacity(4);
            for v in kind.matrices(rows) {
                m.push(im.f64_const(shape.clone(), &v)?);
            }
            [m[0], m[1], m[2], m[3]]
        }
        None => symbolic_matrices(im, &dims[axis], inverse, onesided)?,
    };
    // y = re·p + imag·q (imag absent: re·p).
    let combine = |im: &mut Importer<'_>, p: ExprId, q: ExprId| -> Result<ExprId> {
        let y = im.emit(Op::Matmul { out_dtype: None }, vec![re, p])?;
        match imag {
            Some(i) => {
                let z = im.emit(Op::Matmul { out_dtype: None }, vec![i, q])?;
                im.emit(Op::Add, vec![y, z])
            }
            None => Ok(y),
        }
    };
    let yr = combine(im, a, b)?;
    let expand =
        |im: &mut Importer<'_>, e: ExprId| im.emit(Op::ExpandDims { axis: vec![-1] }, vec![e]);
    let out = if inverse && onesided {
        expand(im, yr)?
    } else {
        let yi = combine(im, c, d)?;
        let (yr, yi) = (expand(im, yr)?, expand(im, yi)?);
        let both = im.b.tuple(vec![yr, yi])?;
        im.emit(Op::Concat { axis: Some(-1) }, vec![both])?
    };
    // The transformed axis back in its place.
    let rr = r as i64;
    let mut back: Vec<i64> = (0..axis as i64).collect();
    back.push(rr - 2);
    back.extend(axis as i64..rr - 2);
    back.push(rr - 1);
    im.emit(Op::PermuteDims { axes: Some(back) }, vec![out])
}

/// `x` as `float64`, and its dtype.
fn widen(im: &mut Importer<'_>, x: ExprId) -> Result<(ExprId, DType)> {
    let (_, dt) = im.dims(x)?;
    if !dt.is_float() {
        return Err(invalid(format!(
            "expected a floating-point signal, found {dt}"
        )));
    }
    let w = if dt == DType::F64 {
        x
    } else {
        im.emit(Op::Astype { dtype: DType::F64 }, vec![x])?
    };
    Ok((w, dt))
}

/// `y` (`float64`) back in `dtype`.
fn narrow(im: &mut Importer<'_>, y: ExprId, dtype: DType) -> Result<Vec<Out>> {
    let y = if dtype == DType::F64 {
        y
    } else {
        im.emit(Op::Astype { dtype }, vec![y])?
    };
    Ok(vec![Out::Val(Val::Expr(y))])
}

/// One constant integer of an optional input.
fn const_int(im: &Importer<'_>, node: &NodeProto, k: usize, what: &str) -> Result<Option<i64>> {
    let Some(name) = input(node, k) else {
        return Ok(None);
    };
    match im.const_i64s(name)?.as_slice() {
        [v] => Ok(Some(*v)),
        v => Err(invalid(format!(
            "{what} must be one integer, found {} values",
            v.len()
        ))),
    }
}

/// `DFT(input[, dft_length[, axis]])`.
pub(crate) fn dft_node(im: &mut Importer<'_>, node: &NodeProto, a: &Attrs<'_>) -> Result<Vec<Out>> {
    let x = im.expr(req(node, 0)?)?;
    let (dims, _) = im.dims(x)?;
    let r = dims.len() as i64;
    let axis = if im.opset >= 20 {
        const_int(im, node, 2, "DFT's axis")?.unwrap_or(-2)
    } else {
        a.int("axis", 1)
    };
    if !(-r..r).contains(&axis) {
        return Err(invalid(format!(
            "DFT's axis {axis} is out of range for an input of rank {r}"
        )));
    }
    let axis = axis.rem_euclid(r) as usize;
    let inverse = a.int("inverse", 0) != 0;
    let onesided = a.int("onesided", 0) != 0;
    let Some(len) = dims.get(axis).and_then(Dim::as_static) else {
        // A symbolic signal length (FNet's FFT over the sequence): the transform of that
        // length, its matrices built at run time.
        if const_int(im, node, 1, "DFT's dft_length")?.is_some() || (inverse && onesided) {
            return Err(invalid(
                "DFT over a symbolic axis supports neither `dft_length` nor the inverse \
                 one-sided transform",
            ));
        }
        let (xw, dt) = widen(im, x)?;
        let y = dft(im, xw, axis, Len::Symbolic { inverse, onesided })?;
        return narrow(im, y, dt);
    };
    let n = match const_int(im, node, 1, "DFT's dft_length")? {
        Some(n) if n >= 1 => n,
        Some(n) => {
            return Err(invalid(format!(
                "DFT's dft_length must be at least 1, found {n}"
            )));
        }
        None if inverse && onesided => 2 * (len - 1),
        None => len,
    };
    let (xw, dt) = widen(im, x)?;
    let kind = Kind {
        n: usize::try_from(n).map_err(|_| invalid("DFT's length is out of range"))?,
        inverse,
        onesided,
    };
    let y = dft(im, xw, axis, Len::Static(kind))?;
    narrow(im, y, dt)
}

/// `STFT(signal, frame_step[, window[, frame_length]])`.
pub(crate) fn stft(im: &mut Importer<'_>, node: &NodeProto, a: &Attrs<'_>) -> Result<Vec<Out>> {
    let x = im.expr(req(node, 0)?)?;
    let (dims, _) = im.dims(x)?;
    if dims.len() != 3 {
        return Err(invalid(format!(
            "STFT's signal must be (batch, length, 1 or 2), found {dims:?}"
        )));
    }
    let len = dims[1]
        .as_static()
        .ok_or_else(|| invalid("STFT's signal length must be static"))?;
    let step = const_int(im, node, 1, "STFT's frame_step")?
        .ok_or_else(|| invalid("STFT needs frame_step"))?;
    let window = match input(node, 2) {
        Some(w) => Some(im.expr(w)?),
        None => None,
    };
    let wlen = match window {
        Some(w) => match im.dims(w)?.0.as_slice() {
            [d] => Some(
                d.as_static()
                    .ok_or_else(|| invalid("STFT's window must be static"))?,
            ),
            d => return Err(invalid(format!("STFT's window must be 1-D, found {d:?}"))),
        },
        None => None,
    };
    let f = match (const_int(im, node, 3, "STFT's frame_length")?, wlen) {
        (Some(f), Some(w)) if f != w => {
            return Err(invalid(format!(
                "STFT's window has {w} values but frame_length is {f}"
            )));
        }
        (Some(f), _) => f,
        (None, Some(w)) => w,
        (None, None) => len,
    };
    if step < 1 || f < 1 || f > len {
        return Err(invalid(format!(
            "STFT needs frame_step ≥ 1 and 1 ≤ frame_length ≤ the signal length {len}, found \
             frame_step {step} and frame_length {f}"
        )));
    }
    let frames = 1 + (len - f) / step;
    if (frames as u128) * (f as u128) > MAX_MATRIX as u128 {
        return Err(invalid(format!(
            "STFT's {frames} frames of {f} values exceed {MAX_MATRIX} gathered indices"
        )));
    }
    let (xw, dt) = widen(im, x)?;
    // Frame t, value j is signal[t·step + j]: (batch, frames, F, c).
    let idx: Vec<i64> = (0..frames)
        .flat_map(|t| (0..f).map(move |j| t * step + j))
        .collect();
    let idx = im.i64_const(vec![frames, f], &idx)?;
    let mut fr = im.take(xw, 1, idx)?;
    if let Some(w) = window {
        let (ww, _) = widen(im, w)?;
        let shape = im.b.shape(vec![Dim::Static(f), Dim::Static(1)]);
        let ww = im.emit(Op::Reshape, vec![ww, shape])?;
        fr = im.emit(Op::Multiply, vec![fr, ww])?;
    }
    let kind = Kind {
        n: f as usize,
        inverse: false,
        onesided: a.int("onesided", 1) != 0,
    };
    let y = dft(im, fr, 2, Len::Static(kind))?;
    narrow(im, y, dt)
}

/// `MelWeightMatrix(num_mel_bins, dft_length, sample_rate, lower_edge_hertz,
/// upper_edge_hertz)` with constant inputs: the `(dft_length/2 + 1, num_mel_bins)` matrix of
/// triangular filters, as ONNX's reference computes it.
pub(crate) fn mel_weight_matrix(
    im: &mut Importer<'_>,
    node: &NodeProto,
    a: &Attrs<'_>,
) -> Result<Vec<Out>> {
    let int = |im: &Importer<'_>, k: usize, what: &str| -> Result<i64> {
        const_int(im, node, k, what)?
            .ok_or_else(|| invalid(format!("MelWeightMatrix needs {what}")))
    };
    let float = |im: &Importer<'_>, k: usize, what: &str| -> Result<f64> {
        match im.const_f64s(req(node, k)?)?.as_slice() {
            [v] => Ok(*v),
            v => Err(invalid(format!(
                "{what} must be one value, found {}",
                v.len()
            ))),
        }
    };
    let mels = int(im, 0, "num_mel_bins")?;
    let dft_len = int(im, 1, "dft_length")?;
    let rate = int(im, 2, "sample_rate")?;
    let (lo, hi) = (
        float(im, 3, "lower_edge_hertz")?,
        float(im, 4, "upper_edge_hertz")?,
    );
    if mels < 1 || dft_len < 1 || rate < 1 || !(0.0..=hi).contains(&lo) || !hi.is_finite() {
        return Err(invalid(format!(
            "MelWeightMatrix needs num_mel_bins, dft_length and sample_rate ≥ 1 and 0 ≤ \
             lower_edge_hertz ≤ upper_edge_hertz (finite), found {mels}, {dft_len}, {rate}, \
             {lo}, {hi}"
        )));
    }
    let bins = dft_len / 2 + 1;
    if (bins as u128) * (mels as u128) > MAX_MATRIX as u128 {
        return Err(invalid(format!(
            "MelWeightMatrix of {bins} × {mels} exceeds {MAX_MATRIX} values"
        )));
    }
    let mel = |hz: f64| 2595.0 * (hz / 700.0).ln_1p() / 10f64.ln();
    let (low, high) = (mel(lo), mel(hi));
    let step = (high - low) / (mels + 2) as f64;
    let edges: Vec<i64> = (0..mels + 2)
        .map(|i| {
            let hz = 700.0 * ((i as f64 * step + low) / 2595.0 * 10f64.ln()).exp_m1();
            (((dft_len + 1) as f64 * hz) / rate as f64).floor() as i64
        })
        .collect();
    let (bins_u, mels_u) = (bins as usize, mels as usize);
    let mut out = vec![0.0f64; bins_u * mels_u];
    let mut set = |j: i64, i: usize, v: f64| -> Result<()> {
        match usize::try_from(j).ok().filter(|&j| j < bins_u) {
            Some(j) => {
                out[j * mels_u + i] = v;
                Ok(())
            }
            None => Err(invalid(format!(
                "MelWeightMatrix: filter {i} reaches bin {j}, outside the {bins} spectrogram bins \
                 (upper_edge_hertz above sample_rate / 2?)"
            ))),
        }
    };
    for i in 0..mels_u {
        let (l, c, h) = (edges[i], edges[i + 1], edges[i + 2]);
        if c == l {
            set(c, i, 1.0)?;
        } else {
            for j in l..=c {
                set(j, i, (j - l) as f64 / (c - l) as f64)?;
            }
        }
        if h > c {
            for j in c..h {
                set(j, i, (h - j) as f64 / (h - c) as f64)?;
            }
        }
    }
    let dtype = match a.int("output_datatype", 1) {
        1 => DType::F32,
        10 => DType::F16,
        11 => DType::F64,
        16 => DType::BF16,
        t => {
            return Err(invalid(format!(
                "MelWeightMatrix's output_datatype {t} is not a floating-point type"
            )));
        }
    };
    let c = im.f64_const(vec![bins, mels], &out)?;
    narrow(im, c, dtype)
}
