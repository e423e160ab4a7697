//! Lowering of the indexing, shape and layout ops of issue 17 to kernel-IR templates:
//! `gather_elements`, `gather_nd`, `one_hot`, `arange`, `tile`, `tril`/`triu` and `nn.pad`
//! (every mode). The scatters and scans are opaque ops (TVM's pattern kind; topi builds them
//! with the IR builder) and are [`Error::Unsupported`](crate::error::Error::Unsupported): they
//! run on the CPU reference.
//!
//! Contract: as the other templates in [`super`], each op is a node over its own output
//! coordinates. Indices read from tensors count from the end when negative (as ONNX) and are
//! clamped into range, so a kernel never reads out of bounds (the CPU reference reports an
//! out-of-range index as an error instead).
//!
//! ```text
//! gv = R.tril(x, k=0)           # x: (4, 4)
//! → out0[c0,c1] = select(c1 - c0 < 1, load x[c0,c1], 0)
//! gv = R.nn.pad(x, pad_width=[1, 1], pad_mode="replicate")   # x: (3,)
//! → out0[c0] = load x[min(max(c0 - 1, 0), 2)]
//! ```

use super::{Lowerer, Val, norm_axis};
use crate::error::Result;
use crate::kir::{Bin, Node, NodeId, Scalar};
use fusebox_core::ir::DType;
use fusebox_core::op::{Op, PadMode};

impl Lowerer<'_> {
    /// `v` (an index into an axis of extent `n`) with negative values counted from the end,
    /// clamped into `[0, n)`.
    fn wrap_index(&mut self, v: NodeId, n: i64) -> NodeId {
        let v = match self.g.scalar(v) {
            Scalar::I64 => v,
            _ => self.g.add(Node::Convert(DType::I64, v)),
        };
        let z = self.g.int(0);
        let neg = self.g.bin(Bin::Lt, v, z);
        let nn = self.g.int(n);
        let plus = self.g.bin(Bin::Add, v, nn);
        let v = self.g.select(neg, plus, v);
        self.clamp_in(v, n).0
    }

    fn axis_of(&self, a: i64, r: usize) -> Result<usize> {
        norm_axis(a, r).ok_or_else(|| self.unsupported("axis out of range".into()))
    }

    /// `a == b` for integer nodes, as `!(a < b) && a < b + 1`.
    fn eq_int(&mut self, a: NodeId, b: NodeId) -> NodeId {
        let one = self.g.int(1);
        let b1 = self.g.bin(Bin::Add, b, one);
        let lt = self.g.bin(Bin::Lt, a, b);
        let lt1 = self.g.bin(Bin::Lt, a, b1);
        let z = self.g.int(0);
        self.g.select(lt, z, lt1)
    }

    /// A fill value of `one_hot`: a prim value or a rank-0 tensor, in scalar `s`.
    fn fill_node(&mut self, v: Option<&Val>, s: Scalar, what: &str) -> Result<NodeId> {
        match v {
            Some(Val::Prim(p)) => Ok(self.fconst(*p, s)),
            Some(Val::T(t)) if t.shape.is_empty() => {
                let n = t.node;
                Ok(if self.g.scalar(n) == s {
                    n
                } else {
                    self.g.add(Node::Convert(t.dtype, n))
                })
            }
            _ => Err(self.unsupported(format!("{what} must be a prim value or a rank-0 tensor"))),
        }
    }

    /// The template of an index op (see the module docs) over output `shape` at coordinates
    /// `c`, in scalar `s` of the output dtype `dtype`.
    pub(super) fn index_op(
        &mut self,
        op: &Op,
        args: &[Val],
        shape: &[u64],
        dtype: DType,
        c: &[NodeId],
    ) -> Result<NodeId> {
        let s = Scalar::of(dtype);
        Ok(match op {
            Op::GatherElements { axis } => {
                let x = self.tensor_arg(args, 0)?.clone();
                let idx = self.tensor_arg(args, 1)?.clone();
                let ax = self.axis_of(*axis, x.shape.len())?;
                if idx.shape.len() != x.shape.len() {
                    return Err(self.unsupported("indices of another rank".into()));
                }
                let iv = self.at(&idx, c);
                let k = self.wrap_index(iv, x.shape[ax] as i64);
                let mut xi = c.to_vec();
                xi[ax] = k;
                self.at(&x, &xi)
            }
            Op::GatherNd { batch_dims } => {
                let x = self.tensor_arg(args, 0)?.clone();
                let idx = self.tensor_arg(args, 1)?.clone();
                let b = usize::try_from(*batch_dims)
                    .map_err(|_| self.unsupported("negative batch_dims".into()))?;
                let q = idx.shape.len();
                let m = idx.shape.last().copied().unwrap_or(0) as usize;
                if q == 0 || b + m > x.shape.len() || c.len() < q - 1 {
                    return Err(self.unsupported("gather_nd shapes do not fit".into()));
                }
                let lead = &c[..q - 1];
                let mut xi: Vec<NodeId> = c[..b].to_vec();
                for k in 0..m {
                    let kk = self.g.int(k as i64);
                    let mut ii = lead.to_vec();
                    ii.push(kk);
                    let iv = self.at(&idx, &ii);
                    xi.push(self.wrap_index(iv, x.shape[b + k] as i64));
                }
                xi.extend_from_slice(&c[q - 1..]);
                self.at(&x, &xi)
            }
            Op::OneHot { depth, axis } => {
                let idx = self.tensor_arg(args, 0)?.clone();
                let ax = self.axis_of(*axis, idx.shape.len() + 1)?;
                let ii: Vec<NodeId> = c
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| *i != ax)
                    .map(|(_, &n)| n)
                    .collect();
                let iv = self.at(&idx, &ii);
                let iv = match self.g.scalar(iv) {
                    Scalar::I64 => iv,
                    _ => self.g.add(Node::Convert(DType::I64, iv)),
                };
                let z = self.g.int(0);
                let neg = self.g.bin(Bin::Lt, iv, z);
                let d = self.g.int(*depth);
                let plus = self.g.bin(Bin::Add, iv, d);
                let iv = self.g.select(neg, plus, iv);
                let hot = self.eq_int(iv, c[ax]);
                let on = self.fill_node(args.get(1), s, "on_value")?;
                let off = self.fill_node(args.get(2), s, "off_value")?;
                self.g.select(hot, on, off)
            }
            Op::Arange(a) => {
                let i = c[0];
                if s == Scalar::I64 {
                    let st = self.g.int(a.start.0 as i64);
                    let step = self.g.int(a.step.0 as i64);
                    let m = self.g.bin(Bin::Mul, i, step);
                    self.g.bin(Bin::Add, st, m)
                } else {
                    let fd = if s == Scalar::F64 {
                        DType::F64
                    } else {
                        DType::F32
                    };
                    let fi = self.g.add(Node::Convert(fd, i));
                    let st = self.fconst(a.start.0, s);
                    let step = self.fconst(a.step.0, s);
                    let m = self.g.bin(Bin::Mul, fi, step);
                    self.g.bin(Bin::Add, st, m)
                }
            }
            Op::Tile { .. } => {
                let x = self.tensor_arg(args, 0)?.clone();
                let off = shape.len().saturating_sub(x.shape.len());
                let mut xi = Vec::with_capacity(x.shape.len());
                for (i, &d) in x.shape.iter().enumerate() {
                    let ci = c[off + i];
                    xi.push(if d == 1 {
                        self.g.int(0)
                    } else {
                        let dn = self.g.int(d as i64);
                        self.g.bin(Bin::Rem, ci, dn)
                    });
                }
                self.at(&x, &xi)
            }
            Op::Tril { k } | Op::Triu { k } => {
                let x = self.tensor_arg(args, 0)?.clone();
                let r = c.len();
                if r < 2 {
                    return Err(self.unsupported("tril/triu of rank below 2".into()));
                }
                let d = self.g.bin(Bin::Sub, c[r - 1], c[r - 2]);
                let xv = self.at(&x, c);
                let zero = self.g.float(0.0, s);
                if matches!(op, Op::Tril { .. }) {
                    let k1 = self.g.int(k.saturating_add(1));
                    let keep = self.g.bin(Bin::Lt, d, k1);
                    self.g.select(keep, xv, zero)
                } else {
                    let kk = self.g.int(*k);
                    let drop = self.g.bin(Bin::Lt, d, kk);
                    self.g.select(drop, zero, xv)
                }
            }
            Op::Pad(a) => {
                let x = self.tensor_arg(args, 0)?.clone();
                if a.pad_width.len() != 2 * x.shape.len() {
                    return Err(self.unsupported("pad_width does not match the rank".into()));
                }
                let mut xi = Vec::with_capacity(x.shape.len());
                let mut inside: Option<NodeId> = None;
                for (d, &n) in x.shape.iter().enumerate() {
                    let n = n as i64;
                    let before = self.g.int(a.pad_width[2 * d]);
                    let i = self.g.bin(Bin::Sub, c[d], before);
                    let j = match a.pad_mode {
                        PadMode::Constant => {
                            let (cl, inb) = self.clamp_in(i, n);
                            inside = Some(match inside {
                                None => inb,
                                Some(prev) => {
                                    let z = self.g.int(0);
                                    self.g.select(prev, inb, z)
                                }
                            });
                            cl
                        }
                        _ if n == 0 => {
                            return Err(self.unsupported("padding an empty axis".into()));
                        }
                        PadMode::Replicate => self.clamp_in(i, n).0,
                        PadMode::Circular => {
                            let nn = self.g.int(n);
                            let r = self.g.bin(Bin::Rem, i, nn);
                            let r2 = self.g.bin(Bin::Add, r, nn);
                            self.g.bin(Bin::Rem, r2, nn)
                        }
                        PadMode::Reflect if n == 1 => self.g.int(0),
                        PadMode::Reflect => {
                            let p = self.g.int(2 * (n - 1));
                            let r = self.g.bin(Bin::Rem, i, p);
                            let r2 = self.g.bin(Bin::Add, r, p);
                            let m = self.g.bin(Bin::Rem, r2, p);
                            let nn = self.g.int(n);
                            let lo = self.g.bin(Bin::Lt, m, nn);
                            let back = self.g.bin(Bin::Sub, p, m);
                            self.g.select(lo, m, back)
                        }
                    };
                    xi.push(j);
                }
                let xv = self.at(&x, &xi);
                match inside {
                    Some(cond) => {
                        let fill = self.fconst(a.pad_value.0, s);
                        self.g.select(cond, xv, fill)
                    }
                    None => xv,
                }
            }
            Op::ScatterElements { .. } | Op::ScatterNd { .. } | Op::Cumsum(_) | Op::Cumprod(_) => {
                return Err(self.unsupported(format!(
                    "{} is an opaque op: it runs on the CPU reference",
                    op.name()
                )));
            }
            _ => {
                return Err(self.unsupported(format!("internal: {} is not an index op", op.name())));
            }
        })
    }
}
