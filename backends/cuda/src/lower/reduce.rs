//! Lowering of the reduction family added for issue 17: `min` and `prod` (reductions like
//! `sum`/`max`), `argmax` / `argmin` (two reductions: the extreme value, then the first index
//! that holds it) and `einsum` (a product of loads summed over the labels missing from the
//! output). `topk` is a sort: it stays opaque ([`Error::Unsupported`]).
//!
//! The reduction variables of `min`, `prod`, `argmax` and `argmin` are row variables, so a
//! reduction over trailing axes becomes row statistics of a row kernel (the extreme of
//! `argmax` is computed once per row). One difference from the CPU reference: the device's
//! max / min skip NaN (`fmaxf`), so a NaN is never the extreme of `min` or `argmax` here.
//!
//! ```text
//! i = R.argmax(x, axis=1, keepdims=False)          # x: (4, 10) float32
//! → stat0 = max_{r} x[c0, r]
//!   stat1 = min_{r'} (x[c0, r'] < stat0 ? 10 : r')   (int64)
//!   out0[c0] = stat1
//! y = R.einsum((a, b), subscripts="ij,jk->ik")
//! → out0[c0, c1] = sum_{r} a[c0, r] * b[r, c1]
//! ```

use super::{Lowerer, Tv, Val, norm_axis};
use crate::error::Result;
use crate::kir::{Bin, Node, NodeId, RedOp};
use fusebox_core::op::Op;
use fusebox_core::op::einsum::EinsumSpec;

impl Lowerer<'_> {
    /// The template of one op of the family over the output coordinates `c` of an output of
    /// `shape`.
    pub(super) fn reduce17(
        &mut self,
        op: &Op,
        args: &[Val],
        shape: &[u64],
        c: &[NodeId],
    ) -> Result<NodeId> {
        match op {
            Op::Min(a) | Op::Prod(a) => {
                let x = self.tensor_arg(args, 0)?.clone();
                let axes = self.reduced_axes(a.axis.as_deref(), x.shape.len())?;
                let (vars, idx) = self.reduce_index(&x, &axes, a.keepdims, c);
                let body = self.at(&x, &idx);
                let rop = if matches!(op, Op::Min(_)) {
                    RedOp::Min
                } else {
                    RedOp::Prod
                };
                Ok(self.g.add(Node::Reduce {
                    op: rop,
                    vars,
                    body,
                }))
            }
            Op::Argmax { axis, keepdims } | Op::Argmin { axis, keepdims } => {
                let x = self.tensor_arg(args, 0)?.clone();
                let largest = matches!(op, Op::Argmax { .. });
                self.arg_reduce(&x, *axis, *keepdims, largest, c)
            }
            Op::Einsum { subscripts } => self.einsum(args, subscripts, shape, c),
            Op::Topk(_) => Err(self.unsupported("topk is a sort: it runs on the CPU".into())),
            _ => Err(self.unsupported(format!("internal: {} is not a reduction", op.name()))),
        }
    }

    /// Normalised, sorted, distinct reduced axes (`None`: all).
    fn reduced_axes(&self, axis: Option<&[i64]>, rank: usize) -> Result<Vec<usize>> {
        let mut o = match axis {
            None => (0..rank).collect(),
            Some(v) => self.axes(v, rank)?,
        };
        o.sort_unstable();
        o.dedup();
        Ok(o)
    }

    /// Row variables for the reduced `axes` of `x` and the input index at the output
    /// coordinates `c` (which skip the reduced axes unless `keepdims`).
    fn reduce_index(
        &mut self,
        x: &Tv,
        axes: &[usize],
        keepdims: bool,
        c: &[NodeId],
    ) -> (Vec<(u32, u64)>, Vec<NodeId>) {
        let mut vars = Vec::new();
        let mut idx = Vec::new();
        let mut oi = 0;
        for (i, &d) in x.shape.iter().enumerate() {
            if axes.contains(&i) {
                let r = self.row_rvar();
                vars.push((r, d));
                idx.push(self.g.add(Node::RVar(r)));
                if keepdims {
                    oi += 1;
                }
            } else {
                let zero = self.g.int(0);
                idx.push(c.get(oi).copied().unwrap_or(zero));
                oi += 1;
            }
        }
        (vars, idx)
    }

    /// `argmax` / `argmin`: the smallest index whose value is not beaten by the extreme.
    fn arg_reduce(
        &mut self,
        x: &Tv,
        axis: Option<i64>,
        keepdims: bool,
        largest: bool,
        c: &[NodeId],
    ) -> Result<NodeId> {
        if !x.dtype.is_float() {
            return Err(self.unsupported(format!(
                "arg reductions of {} data stay on the CPU",
                x.dtype
            )));
        }
        let rank = x.shape.len();
        let axes: Vec<usize> = match axis {
            Some(a) => vec![
                norm_axis(a, rank).ok_or_else(|| self.unsupported("axis out of range".into()))?,
            ],
            None => (0..rank).collect(),
        };
        let n: u64 = axes.iter().map(|&a| x.shape[a]).product();
        if n == 0 {
            return Err(self.unsupported("an arg reduction over an empty extent".into()));
        }
        // The extreme value.
        let (vars, idx) = self.reduce_index(x, &axes, keepdims, c);
        let xv = self.at(x, &idx);
        let ext = self.g.add(Node::Reduce {
            op: if largest { RedOp::Max } else { RedOp::Min },
            vars,
            body: xv,
        });
        // The first (linear) index that holds it.
        let (vars2, idx2) = self.reduce_index(x, &axes, keepdims, c);
        let xv2 = self.at(x, &idx2);
        let beaten = if largest {
            self.g.bin(Bin::Lt, xv2, ext)
        } else {
            self.g.bin(Bin::Lt, ext, xv2)
        };
        let mut lin = self.g.int(0);
        for &(r, e) in &vars2 {
            let en = self.g.int(e as i64);
            let m = self.g.bin(Bin::Mul, lin, en);
            let rn = self.g.add(Node::RVar(r));
            lin = self.g.bin(Bin::Add, m, rn);
        }
        let none = self.g.int(n as i64);
        let cand = self.g.select(beaten, none, lin);
        Ok(self.g.add(Node::Reduce {
            op: RedOp::Min,
            vars: vars2,
            body: cand,
        }))
    }

    /// `einsum`: the product of the operands' loads, summed over the labels not in the output.
    fn einsum(
        &mut self,
        args: &[Val],
        subscripts: &str,
        shape: &[u64],
        c: &[NodeId],
    ) -> Result<NodeId> {
        let parts: Vec<Tv> = match args.first() {
            Some(Val::Tuple(f)) => f
                .iter()
                .map(|v| match v {
                    Val::T(t) => Ok(t.clone()),
                    _ => Err(self.unsupported("einsum of a non-tensor".into())),
                })
                .collect::<Result<_>>()?,
            _ => return Err(self.unsupported("einsum takes a tuple".into())),
        };
        let ranks: Vec<usize> = parts.iter().map(|t| t.shape.len()).collect();
        let spec = EinsumSpec::parse(subscripts, &ranks).map_err(|e| self.unsupported(e))?;
        let shapes: Vec<&[u64]> = parts.iter().map(|t| t.shape.as_slice()).collect();
        let ext = spec
            .label_extents(&shapes, |a, b| a == b, |d| *d == 1, ToString::to_string)
            .map_err(|e| self.unsupported(e))?;
        if spec.output.len() != shape.len() {
            return Err(self.unsupported("einsum output rank differs from its type".into()));
        }
        // Each label's node: an output coordinate or a reduction variable.
        let zero = self.g.int(0);
        let mut label_node = vec![zero; spec.n_labels];
        for (k, &l) in spec.output.iter().enumerate() {
            if let (Some(slot), Some(&ck)) = (label_node.get_mut(l), c.get(k)) {
                *slot = ck;
            }
        }
        let mut vars = Vec::new();
        for l in 0..spec.n_labels {
            if spec.output.contains(&l) {
                continue;
            }
            let e = ext.get(l).copied().flatten().unwrap_or(1);
            let r = self.g.fresh_rvar();
            vars.push((r, e));
            if let Some(slot) = label_node.get_mut(l) {
                *slot = self.g.add(Node::RVar(r));
            }
        }
        let mut prod: Option<NodeId> = None;
        for (t, labels) in parts.iter().zip(&spec.inputs) {
            let idx: Vec<NodeId> = labels
                .iter()
                .zip(&t.shape)
                .map(|(&l, &d)| {
                    if d == 1 {
                        zero
                    } else {
                        label_node.get(l).copied().unwrap_or(zero)
                    }
                })
                .collect();
            let v = self.at(t, &idx);
            prod = Some(match prod {
                None => v,
                Some(p) => self.g.bin(Bin::Mul, p, v),
            });
        }
        let Some(body) = prod else {
            return Err(self.unsupported("einsum without operands".into()));
        };
        if vars.is_empty() {
            return Ok(body);
        }
        if vars.iter().any(|v| v.1 == 0) {
            let s = self.g.scalar(body);
            return Ok(self.fconst(0.0, s));
        }
        Ok(self.g.add(Node::Reduce {
            op: RedOp::Sum,
            vars,
            body,
        }))
    }
}
