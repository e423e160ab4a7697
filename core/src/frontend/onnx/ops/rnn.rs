//! ONNX's recurrent layers `RNN`, `GRU` and `LSTM`, unrolled at import time over their static
//! sequence length into the op set's matmuls and elementwise ops.
//!
//! Contract:
//!
//! - The sequence length must be static (the loop is unrolled); `sequence_lens`, when given,
//!   must be a constant equal to it for every batch entry (padding masks are not supported and
//!   are an error, never a silently wrong result).
//! - Every direction (`forward`, `reverse`, `bidirectional`), both layouts, optional biases and
//!   initial states, LSTM peepholes and `input_forget`, GRU's `linear_before_reset`, `clip`,
//!   and the activations ONNX lists (Relu, Tanh, Sigmoid, Affine, LeakyRelu, ThresholdedRelu,
//!   ScaledTanh, HardSigmoid, Elu, Softsign, Softplus) with their alpha/beta follow the ONNX
//!   operator definitions. Gate order in `W`/`R`/`B`: RNN `i`; GRU `z, r, h`; LSTM `i, o, f, c`.
//! - The input projection `X · Wᵀ` is one matmul over all time steps; each step adds
//!   `H · Rᵀ` and applies the gates. Outputs `Y`, `Y_h` (and LSTM's `Y_c`) in ONNX's shapes.
//!
//! ```text
//! Y, Y_h = RNN(X: f32[2, 1, 3], W: f32[1, 4, 3], R: f32[1, 4, 4])
//!   → xw = R.matmul(X, R.permute_dims(W[0]))                     # [2, 1, 4]
//!     h1 = R.tanh(xw[0] + R.matmul(h0, R.permute_dims(R[0])))    # per step
//!     h2 = R.tanh(xw[1] + R.matmul(h1, R.permute_dims(R[0])))
//!     Y = R.concat([h1, h2] as [1, 1, 1, 4] each, axis=0); Y_h = h2 as [1, 1, 4]
//! ```

use super::super::{Attrs, Importer, NodeProto, Out, Val, input, invalid, req};
use crate::error::Result;
use crate::ir::{DType, ExprId};
use crate::op::{Op, StridedSliceAttrs};

/// One activation function with its alpha/beta.
#[derive(Clone, Debug)]
struct Act {
    name: String,
    alpha: Option<f64>,
    beta: Option<f64>,
}

struct Cell<'a, 'm> {
    im: &'a mut Importer<'m>,
    dt: DType,
}

impl Cell<'_, '_> {
    fn emit(&mut self, op: Op, args: Vec<ExprId>) -> Result<ExprId> {
        self.im.emit(op, args)
    }
    fn scalar(&mut self, v: f64) -> ExprId {
        self.im.scalar(v, self.dt)
    }
    fn bin(&mut self, op: Op, a: ExprId, b: ExprId) -> Result<ExprId> {
        self.emit(op, vec![a, b])
    }
    /// `x[begin..end]` along `axis`.
    fn slice(&mut self, x: ExprId, axis: i64, begin: i64, end: i64) -> Result<ExprId> {
        self.emit(
            Op::StridedSlice(Box::new(StridedSliceAttrs {
                axes: vec![axis],
                begin: vec![begin],
                end: vec![end],
                strides: None,
                assume_inbound: true,
            })),
            vec![x],
        )
    }
    /// `x[i]` along axis 0, the axis dropped.
    fn index0(&mut self, x: ExprId, i: i64) -> Result<ExprId> {
        let s = self.slice(x, 0, i, i + 1)?;
        self.emit(
            Op::Squeeze {
                axis: Some(vec![0]),
            },
            vec![s],
        )
    }
    fn transpose(&mut self, x: ExprId) -> Result<ExprId> {
        self.emit(Op::PermuteDims { axes: None }, vec![x])
    }
    fn matmul(&mut self, a: ExprId, b: ExprId) -> Result<ExprId> {
        self.emit(Op::Matmul { out_dtype: None }, vec![a, b])
    }
    fn clip(&mut self, x: ExprId, clip: Option<f64>) -> Result<ExprId> {
        let Some(c) = clip else { return Ok(x) };
        let lo = self.scalar(-c);
        let hi = self.scalar(c);
        let x = self.bin(Op::Maximum, x, lo)?;
        self.bin(Op::Minimum, x, hi)
    }
    /// `f(x)` for an ONNX activation name.
    fn act(&mut self, f: &Act, x: ExprId) -> Result<ExprId> {
        let alpha = |d: f64| f.alpha.unwrap_or(d);
        let beta = |d: f64| f.beta.unwrap_or(d);
        match f.name.to_ascii_lowercase().as_str() {
            "sigmoid" => self.emit(Op::Sigmoid, vec![x]),
            "tanh" => self.emit(Op::Tanh, vec![x]),
            "relu" => self.emit(Op::Relu, vec![x]),
            "affine" => {
                let a = self.scalar(alpha(1.0));
                let b = self.scalar(beta(0.0));
                let ax = self.bin(Op::Multiply, x, a)?;
                self.bin(Op::Add, ax, b)
            }
            "leakyrelu" => {
                let al = alpha(0.01);
                let a = self.scalar(al);
                let ax = self.bin(Op::Multiply, x, a)?;
                let op = if al <= 1.0 { Op::Maximum } else { Op::Minimum };
                self.bin(op, x, ax)
            }
            "thresholdedrelu" => Err(invalid(
                "activation ThresholdedRelu is not supported in recurrent layers",
            )),
            "scaledtanh" => {
                let a = self.scalar(alpha(1.0));
                let b = self.scalar(beta(1.0));
                let bx = self.bin(Op::Multiply, x, b)?;
                let t = self.emit(Op::Tanh, vec![bx])?;
                self.bin(Op::Multiply, t, a)
            }
            "hardsigmoid" => {
                let a = self.scalar(alpha(0.2));
                let b = self.scalar(beta(0.5));
                let ax = self.bin(Op::Multiply, x, a)?;
                let y = self.bin(Op::Add, ax, b)?;
                let zero = self.scalar(0.0);
                let one = self.scalar(1.0);
                let y = self.bin(Op::Maximum, y, zero)?;
                self.bin(Op::Minimum, y, one)
            }
            "elu" => {
                let zero = self.scalar(0.0);
                let one = self.scalar(1.0);
                let a = self.scalar(alpha(1.0));
                let pos = self.emit(Op::Relu, vec![x])?;
                let mn = self.bin(Op::Minimum, x, zero)?;
                let ex = self.emit(Op::Exp, vec![mn])?;
                let em1 = self.bin(Op::Subtract, ex, one)?;
                let neg = self.bin(Op::Multiply, em1, a)?;
                self.bin(Op::Add, pos, neg)
            }
            "softsign" => {
                let one = self.scalar(1.0);
                let ab = self.emit(Op::Abs, vec![x])?;
                let d = self.bin(Op::Add, ab, one)?;
                self.bin(Op::Divide, x, d)
            }
            "softplus" => {
                let one = self.scalar(1.0);
                let ex = self.emit(Op::Exp, vec![x])?;
                let s = self.bin(Op::Add, ex, one)?;
                self.emit(Op::Log, vec![s])
            }
            other => Err(invalid(format!("unknown activation `{other}`"))),
        }
    }
}

/// Which recurrent layer.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Rnn,
    Gru,
    Lstm,
}

/// `RNN`, `GRU` and `LSTM` (see the module docs).
pub(crate) fn recurrent(im: &mut Importer<'_>, node: &NodeProto) -> Result<Vec<Out>> {
    let a = Attrs(node);
    let kind = match node.op_type.as_str() {
        "RNN" => Kind::Rnn,
        "GRU" => Kind::Gru,
        _ => Kind::Lstm,
    };
    let gates: i64 = match kind {
        Kind::Rnn => 1,
        Kind::Gru => 3,
        Kind::Lstm => 4,
    };
    let mut x = im.expr(req(node, 0)?)?;
    let w = im.expr(req(node, 1)?)?;
    let r = im.expr(req(node, 2)?)?;
    let (xd, dt) = im.dims(x)?;
    if !dt.is_float() {
        return Err(invalid(format!("X must be a float tensor, found {dt}")));
    }
    let layout = a.int("layout", 0);
    if xd.len() != 3 {
        return Err(invalid(format!("X must have rank 3, found {}", xd.len())));
    }
    let s_dim = if layout == 0 { 0 } else { 1 };
    let seq = xd[s_dim]
        .as_static()
        .ok_or_else(|| invalid("the sequence length must be static (the loop is unrolled)"))?;
    if seq > 4096 {
        return Err(invalid(format!(
            "sequence length {seq} is too long to unroll (max 4096)"
        )));
    }
    let (wd, _) = im.dims(w)?;
    let hidden = match a.has("hidden_size") {
        true => a.int("hidden_size", 0),
        false => wd
            .get(1)
            .and_then(|d| d.as_static())
            .map(|g| g / gates)
            .ok_or_else(|| invalid("W must have a static shape"))?,
    };
    if hidden <= 0 || wd.get(1).and_then(|d| d.as_static()) != Some(gates * hidden) {
        return Err(invalid(format!(
            "W must be [num_directions, {gates} × hidden_size, input_size], found {wd:?} with \
             hidden_size {hidden}"
        )));
    }
    let direction = a.string("direction", "forward");
    let dirs: Vec<bool> = match direction.as_str() {
        "forward" => vec![false],
        "reverse" => vec![true],
        "bidirectional" => vec![false, true],
        other => return Err(invalid(format!("unknown direction `{other}`"))),
    };
    if wd.first().and_then(|d| d.as_static()) != Some(dirs.len() as i64) {
        return Err(invalid(format!(
            "W's first dim must be the number of directions ({}), found {wd:?}",
            dirs.len()
        )));
    }
    if let Some(sl) = input(node, 4) {
        let lens = im.const_i64s(sl).map_err(|_| {
            invalid("`sequence_lens` must be a constant (per-batch lengths are not supported)")
        })?;
        if lens.iter().any(|&l| l != seq) {
            return Err(invalid(format!(
                "`sequence_lens` {lens:?} differ from the sequence length {seq}; padded batches \
                 are not supported"
            )));
        }
    }
    // Activations: per direction, `per` functions each.
    let per = match kind {
        Kind::Rnn => 1,
        Kind::Gru => 2,
        Kind::Lstm => 3,
    };
    let defaults: Vec<&str> = match kind {
        Kind::Rnn => vec!["Tanh"],
        Kind::Gru => vec!["Sigmoid", "Tanh"],
        Kind::Lstm => vec!["Sigmoid", "Tanh", "Tanh"],
    };
    let names: Vec<String> = match a.strings("activations") {
        Some(v) if !v.is_empty() => v,
        _ => defaults
            .iter()
            .cycle()
            .take(per * dirs.len())
            .map(|s| (*s).to_string())
            .collect(),
    };
    if names.len() != per * dirs.len() {
        return Err(invalid(format!(
            "`activations` must list {} functions, found {}",
            per * dirs.len(),
            names.len()
        )));
    }
    let alphas = a.floats("activation_alpha").unwrap_or_default();
    let betas = a.floats("activation_beta").unwrap_or_default();
    let acts: Vec<Act> = names
        .into_iter()
        .enumerate()
        .map(|(i, name)| Act {
            name,
            alpha: alphas.get(i).map(|&v| f64::from(v)),
            beta: betas.get(i).map(|&v| f64::from(v)),
        })
        .collect();
    let clip = a.has("clip").then(|| a.float("clip", 0.0));
    let linear_before_reset = a.int("linear_before_reset", 0) != 0;
    let input_forget = a.int("input_forget", 0) != 0;
    let b = input(node, 3).map(|n| im.expr(n)).transpose()?;
    let h0 = input(node, 5).map(|n| im.expr(n)).transpose()?;
    let c0 = input(node, 6).map(|n| im.expr(n)).transpose()?;
    let p = input(node, 7).map(|n| im.expr(n)).transpose()?;

    let mut c = Cell { im, dt };
    if layout != 0 {
        // [batch, seq, input] → [seq, batch, input]
        x = c.emit(
            Op::PermuteDims {
                axes: Some(vec![1, 0, 2]),
            },
            vec![x],
        )?;
    }
    let h = hidden;
    let mut ys = Vec::new();
    let mut yhs = Vec::new();
    let mut ycs = Vec::new();
    for (d, &reverse) in dirs.iter().enumerate() {
        let d = d as i64;
        let wt = c.index0(w, d)?;
        let wt = c.transpose(wt)?; // [input, G·H]
        let rt = c.index0(r, d)?;
        let rt = c.transpose(rt)?; // [H, G·H]
        let mut xw = c.matmul(x, wt)?; // [seq, batch, G·H]
        let mut rb = None;
        if let Some(b) = b {
            let bd = c.index0(b, d)?; // [2·G·H]
            let wb = c.slice(bd, 0, 0, gates * h)?;
            let rbias = c.slice(bd, 0, gates * h, 2 * gates * h)?;
            if kind == Kind::Gru {
                // h's recurrent bias may sit inside the reset product: keep Rb apart.
                xw = c.bin(Op::Add, xw, wb)?;
                rb = Some(rbias);
            } else {
                let both = c.bin(Op::Add, wb, rbias)?;
                xw = c.bin(Op::Add, xw, both)?;
            }
        }
        let zeros_like = |c: &mut Cell<'_, '_>| -> Result<ExprId> {
            // [batch, H] zeros: 0 · xw[0][:, :H].
            let x0 = c.index0(xw, 0)?;
            let s = c.slice(x0, 1, 0, h)?;
            let z = c.scalar(0.0);
            c.bin(Op::Multiply, s, z)
        };
        let mut hp = match h0 {
            Some(h0) => c.index0(h0, d)?,
            None => zeros_like(&mut c)?,
        };
        let mut cp = match (kind, c0) {
            (Kind::Lstm, Some(c0)) => Some(c.index0(c0, d)?),
            (Kind::Lstm, None) => Some(zeros_like(&mut c)?),
            _ => None,
        };
        let peep = match (kind, p) {
            (Kind::Lstm, Some(p)) => {
                let pd = c.index0(p, d)?;
                Some([
                    c.slice(pd, 0, 0, h)?,
                    c.slice(pd, 0, h, 2 * h)?,
                    c.slice(pd, 0, 2 * h, 3 * h)?,
                ])
            }
            _ => None,
        };
        let f = &acts[d as usize * per..(d as usize + 1) * per];
        let mut outs: Vec<ExprId> = vec![hp; seq as usize];
        let steps: Vec<i64> = if reverse {
            (0..seq).rev().collect()
        } else {
            (0..seq).collect()
        };
        for t in steps {
            let xt = c.index0(xw, t)?; // [batch, G·H]
            let hr = c.matmul(hp, rt)?; // [batch, G·H]
            let gate = |c: &mut Cell<'_, '_>, v: ExprId, k: i64| c.slice(v, 1, k * h, (k + 1) * h);
            match kind {
                Kind::Rnn => {
                    let s = c.bin(Op::Add, xt, hr)?;
                    let s = c.clip(s, clip)?;
                    hp = c.act(&f[0], s)?;
                }
                Kind::Gru => {
                    let hr = match rb {
                        Some(rb) => c.bin(Op::Add, hr, rb)?,
                        None => hr,
                    };
                    let (xz, xr, xh) = (
                        gate(&mut c, xt, 0)?,
                        gate(&mut c, xt, 1)?,
                        gate(&mut c, xt, 2)?,
                    );
                    let (hz, hrr, hh) = (
                        gate(&mut c, hr, 0)?,
                        gate(&mut c, hr, 1)?,
                        gate(&mut c, hr, 2)?,
                    );
                    let z = c.bin(Op::Add, xz, hz)?;
                    let z = c.clip(z, clip)?;
                    let z = c.act(&f[0], z)?;
                    let rr = c.bin(Op::Add, xr, hrr)?;
                    let rr = c.clip(rr, clip)?;
                    let rr = c.act(&f[0], rr)?;
                    let pre = if linear_before_reset {
                        // xh + r ⊙ (H·Rhᵀ + Rbh)
                        let m = c.bin(Op::Multiply, rr, hh)?;
                        c.bin(Op::Add, xh, m)?
                    } else {
                        // xh + (r ⊙ H)·Rhᵀ + Rbh
                        let rh = c.bin(Op::Multiply, rr, hp)?;
                        let rh_t = c.slice(rt, 1, 2 * h, 3 * h)?;
                        let m = c.matmul(rh, rh_t)?;
                        let m = match rb {
                            Some(rb) => {
                                let rbh = c.slice(rb, 0, 2 * h, 3 * h)?;
                                c.bin(Op::Add, m, rbh)?
                            }
                            None => m,
                        };
                        c.bin(Op::Add, xh, m)?
                    };
                    let pre = c.clip(pre, clip)?;
                    let hh = c.act(&f[1], pre)?;
                    // H = (1 - z) ⊙ h + z ⊙ H_prev = h + z ⊙ (H_prev - h)
                    let diff = c.bin(Op::Subtract, hp, hh)?;
                    let zd = c.bin(Op::Multiply, z, diff)?;
                    hp = c.bin(Op::Add, hh, zd)?;
                }
                Kind::Lstm => {
                    let s = c.bin(Op::Add, xt, hr)?;
                    let cprev = cp.ok_or_else(|| invalid("internal: LSTM cell state"))?;
                    let (si, so, sf, sc) = (
                        gate(&mut c, s, 0)?,
                        gate(&mut c, s, 1)?,
                        gate(&mut c, s, 2)?,
                        gate(&mut c, s, 3)?,
                    );
                    let (si, sf) = match peep {
                        Some([pi, _, pf]) => {
                            let a = c.bin(Op::Multiply, pi, cprev)?;
                            let b = c.bin(Op::Multiply, pf, cprev)?;
                            (c.bin(Op::Add, si, a)?, c.bin(Op::Add, sf, b)?)
                        }
                        None => (si, sf),
                    };
                    let si = c.clip(si, clip)?;
                    let it = c.act(&f[0], si)?;
                    let ft = if input_forget {
                        let one = c.scalar(1.0);
                        c.bin(Op::Subtract, one, it)?
                    } else {
                        let sf = c.clip(sf, clip)?;
                        c.act(&f[0], sf)?
                    };
                    let sc = c.clip(sc, clip)?;
                    let ct = c.act(&f[1], sc)?;
                    let a1 = c.bin(Op::Multiply, ft, cprev)?;
                    let a2 = c.bin(Op::Multiply, it, ct)?;
                    let cnew = c.bin(Op::Add, a1, a2)?;
                    let so = match peep {
                        Some([_, po, _]) => {
                            let m = c.bin(Op::Multiply, po, cnew)?;
                            c.bin(Op::Add, so, m)?
                        }
                        None => so,
                    };
                    let so = c.clip(so, clip)?;
                    let ot = c.act(&f[0], so)?;
                    let hc = c.act(&f[2], cnew)?;
                    hp = c.bin(Op::Multiply, ot, hc)?;
                    cp = Some(cnew);
                }
            }
            outs[t as usize] = hp;
        }
        // Y for this direction: [seq, 1, batch, H].
        let mut steps_e = Vec::with_capacity(outs.len());
        for o in outs {
            steps_e.push(c.emit(Op::ExpandDims { axis: vec![0, 1] }, vec![o])?);
        }
        let tup = c.im.b.tuple(steps_e)?;
        ys.push(c.emit(Op::Concat { axis: Some(0) }, vec![tup])?);
        yhs.push(c.emit(Op::ExpandDims { axis: vec![0] }, vec![hp])?);
        if let Some(cp) = cp {
            ycs.push(c.emit(Op::ExpandDims { axis: vec![0] }, vec![cp])?);
        }
    }
    let cat = |c: &mut Cell<'_, '_>, v: Vec<ExprId>, axis: i64| -> Result<ExprId> {
        if v.len() == 1 {
            return Ok(v[0]);
        }
        let t = c.im.b.tuple(v)?;
        c.emit(Op::Concat { axis: Some(axis) }, vec![t])
    };
    let mut y = cat(&mut c, ys, 1)?; // [seq, dirs, batch, H]
    let mut yh = cat(&mut c, yhs, 0)?; // [dirs, batch, H]
    let mut yc = if ycs.is_empty() {
        None
    } else {
        Some(cat(&mut c, ycs, 0)?)
    };
    if layout != 0 {
        y = c.emit(
            Op::PermuteDims {
                axes: Some(vec![2, 0, 1, 3]),
            },
            vec![y],
        )?;
        let swap = |c: &mut Cell<'_, '_>, e: ExprId| {
            c.emit(
                Op::PermuteDims {
                    axes: Some(vec![1, 0, 2]),
                },
                vec![e],
            )
        };
        yh = swap(&mut c, yh)?;
        yc = yc.map(|e| swap(&mut c, e)).transpose()?;
    }
    let mut out = vec![Out::Val(Val::Expr(y)), Out::Val(Val::Expr(yh))];
    if let Some(yc) = yc {
        out.push(Out::Val(Val::Expr(yc)));
    }
    Ok(out)
}
