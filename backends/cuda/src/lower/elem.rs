//! Lowering of the elementwise comparison / logic / bitwise / `where` / math family
//! ([`ElemOp`], issue 17) to kernel-IR templates.
//!
//! Contract: each op becomes one template over its output coordinates, its operands read
//! with numpy broadcasting. Comparisons compute `1`/`0` in the operands' scalar and convert
//! to `bool`; logical ops work on `bool` data held as `0`/`1` integers (`and` = `*`, `or` =
//! `max`, `xor` = `!=`, `not` = `== 0`); `where` is a [`Node::Select`]; bitwise ops and shifts
//! compute in the integer scalar and convert back to the dtype's width (so `uint8` and `int32`
//! wrap as the CPU reference does); `isnan`/`isinf`/`isfinite` of integer data are constants;
//! `floor`/`ceil`/`round` of integer data are the data. Integer `add`/`subtract`/`multiply`
//! (lowered by the parent module) are wrapped to their dtype's width by [`Lowerer::wrap_int`].
//!
//! ```text
//! y = R.where(R.less(a, b), a, R.const(0, "float32"))     # a: [4, 8], b: [8]
//! → out0[c0,c1] = select(convert<bool>(a[c0,c1] < b[c1]), a[c0,c1], 0.0f)
//! ```

use super::{Lowerer, Tv, Val};
use crate::error::Result;
use crate::kir::{Bin, Node, NodeId, Scalar, Un};
use fusebox_core::ir::DType;
use fusebox_core::op::{ElemClass, ElemOp, Op};

impl Lowerer<'_> {
    /// Integer `add`/`subtract`/`multiply` results wrapped to the dtype's width (and `bool`
    /// results to 0/1), so every intermediate holds what the CPU reference stores: the integer
    /// scalar is wider than `int8`/`uint8`/`int32`.
    pub(super) fn wrap_int(&mut self, op: &Op, node: NodeId, dtype: DType) -> NodeId {
        let narrow = (dtype.is_int() && dtype != DType::I64) || dtype == DType::Bool;
        if narrow && matches!(op, Op::Add | Op::Subtract | Op::Multiply) {
            self.g.add(Node::Convert(dtype, node))
        } else {
            node
        }
    }

    /// The template of `e` over output coordinates `c` of `shape` (result dtype `dtype`).
    pub(super) fn elem(
        &mut self,
        e: ElemOp,
        args: &[Val],
        shape: &[u64],
        dtype: DType,
        c: &[NodeId],
    ) -> Result<NodeId> {
        let mut xs: Vec<(NodeId, DType)> = Vec::with_capacity(e.arity());
        for i in 0..e.arity() {
            let t: Tv = self.tensor_arg(args, i)?.clone();
            let v = self.broadcast_at(&t, shape, c);
            xs.push((v, t.dtype));
        }
        let arg = |i: usize| xs.get(i).copied();
        let (x, xd) = arg(0).ok_or_else(|| self.unsupported("missing argument 0".into()))?;
        let y = arg(1);
        let need_y = |l: &Self| y.ok_or_else(|| l.unsupported("missing argument 1".into()));
        let g = &mut self.g;
        let bool_of = |g: &mut crate::kir::Graph, v: NodeId| g.add(Node::Convert(DType::Bool, v));
        Ok(match e.class() {
            ElemClass::Compare => {
                let (y, _) = need_y(self)?;
                let g = &mut self.g;
                let v = match e {
                    ElemOp::Equal => g.bin(Bin::Eq, x, y),
                    ElemOp::NotEqual => g.bin(Bin::Ne, x, y),
                    ElemOp::Less => g.bin(Bin::Lt, x, y),
                    ElemOp::LessEqual => g.bin(Bin::Le, x, y),
                    ElemOp::Greater => g.bin(Bin::Lt, y, x),
                    _ => g.bin(Bin::Le, y, x),
                };
                bool_of(g, v)
            }
            ElemClass::Logical => {
                if e == ElemOp::LogicalNot {
                    let z = g.int(0);
                    let v = g.bin(Bin::Eq, x, z);
                    return Ok(bool_of(g, v));
                }
                let (y, _) = need_y(self)?;
                let g = &mut self.g;
                let v = match e {
                    ElemOp::LogicalAnd => g.bin(Bin::Mul, x, y),
                    ElemOp::LogicalOr => g.bin(Bin::Max, x, y),
                    _ => g.bin(Bin::Ne, x, y),
                };
                bool_of(g, v)
            }
            ElemClass::Bitwise => {
                if e == ElemOp::BitwiseNot {
                    if xd == DType::Bool {
                        let z = g.int(0);
                        let v = g.bin(Bin::Eq, x, z);
                        return Ok(bool_of(g, v));
                    }
                    let v = g.un(Un::BitNot, x);
                    return Ok(g.add(Node::Convert(xd, v)));
                }
                let (y, _) = need_y(self)?;
                let g = &mut self.g;
                let v = match e {
                    ElemOp::BitwiseAnd => g.bin(Bin::BitAnd, x, y),
                    ElemOp::BitwiseOr => g.bin(Bin::BitOr, x, y),
                    ElemOp::BitwiseXor => g.bin(Bin::BitXor, x, y),
                    ElemOp::LeftShift => g.bin(Bin::Shl, x, y),
                    _ => g.bin(Bin::Shr, x, y),
                };
                if dtype == DType::I64 {
                    v
                } else {
                    g.add(Node::Convert(dtype, v))
                }
            }
            ElemClass::Select => {
                let (a, _) = need_y(self)?;
                let (b, _) = arg(2).ok_or_else(|| self.unsupported("missing argument 2".into()))?;
                self.g.select(x, a, b)
            }
            ElemClass::Classify => {
                if !xd.is_float() {
                    return Ok(g.int(i64::from(e == ElemOp::IsFinite)));
                }
                let v = match e {
                    ElemOp::IsNan => g.un(Un::IsNan, x),
                    ElemOp::IsInf => g.un(Un::IsInf, x),
                    _ => {
                        // finite: neither NaN nor infinite.
                        let n = g.un(Un::IsNan, x);
                        let i = g.un(Un::IsInf, x);
                        let ni = g.bin(Bin::Max, n, i);
                        let z = g.float(0.0, Scalar::of(xd));
                        g.bin(Bin::Eq, ni, z)
                    }
                };
                bool_of(g, v)
            }
            ElemClass::Modulo => {
                let (y, _) = need_y(self)?;
                let k = if e == ElemOp::FloorMod {
                    Bin::FloorMod
                } else {
                    Bin::TruncMod
                };
                self.g.bin(k, x, y)
            }
            ElemClass::Rounding | ElemClass::FloatMath => {
                if !xd.is_float() && e != ElemOp::Sign {
                    // floor/ceil/round of an integer is the integer.
                    return Ok(x);
                }
                let k = match e {
                    ElemOp::Floor => Un::Floor,
                    ElemOp::Ceil => Un::Ceil,
                    ElemOp::Round => Un::Round,
                    ElemOp::Sign => Un::Sign,
                    ElemOp::Sin => Un::Sin,
                    ElemOp::Cos => Un::Cos,
                    ElemOp::Tan => Un::Tan,
                    ElemOp::Asin => Un::Asin,
                    ElemOp::Acos => Un::Acos,
                    ElemOp::Atan => Un::Atan,
                    ElemOp::Sinh => Un::Sinh,
                    ElemOp::Cosh => Un::Cosh,
                    ElemOp::Asinh => Un::Asinh,
                    ElemOp::Acosh => Un::Acosh,
                    _ => Un::Atanh,
                };
                g.un(k, x)
            }
        })
    }
}
