//! ConvertLayout: every `conv2d` is rewritten to a desired data and kernel layout (TVM Relax's
//! `relax.transform.ConvertLayout({"relax.nn.conv2d": [data, kernel]})`), and the new layout
//! travels through the layout-agnostic ops after it, so that `permute_dims` are left only
//! where a value meets an op that needs the original layout.
//!
//! Contract:
//!
//! - **Requires** a module that verifies; `data` is a permutation of `NCHW` and `kernel` one of
//!   `OIHW` (else an error naming what was given).
//! - **Rewrites**, in every function without `Primitive`, `Composite` or `Codegen`, block by
//!   block in binding order. A value may be held *permuted*: `v'` with `v = permute_dims(v',
//!   inverse(p))` for an axis permutation `p` of its rank-4 value. Then:
//!   - `y = conv2d(x, w)` (rank-4 operands, layouts not already the desired ones) becomes
//!     `y' = conv2d(x', w')` with `data_layout = out_layout = data` and `kernel_layout =
//!     kernel`, `x'` and `w'` the operands permuted to those layouts (a held operand is
//!     permuted from where it is held, or used as it is); `y` is held as `y'`.
//!   - A unary elementwise op (`relu`, `clip`, `astype`, `exp`, ... : FuseOps' `ElemWise`
//!     kind, not `tril`/`triu`) of a held operand is computed on the held value.
//!   - A broadcasting op (`add`, `multiply`, `maximum`, `where`, ...: FuseOps' `Broadcast`
//!     kind, not `broadcast_to`) with a rank-4 result and a held operand is computed in the
//!     held layout: rank-4 operands are permuted the same way (one `permute_dims`; a constant
//!     folds later), a scalar stays, and a lower-rank operand first gets leading unit axes
//!     (`expand_dims`: what broadcasting does to it) and is then permuted, so a `(C, 1, 1)`
//!     bias meets its channels.
//!   - `max_pool2d`, `avg_pool2d` and `adaptive_avg_pool2d` of a held operand run with their
//!     `layout` (and `out_layout`) permuted likewise.
//!   - `y = v` of a held `v` (an alias, as `emit_output` makes): `y` is held as `v` is.
//!   - Anything else that reads a held value reads the original: `v = permute_dims(v', ...)`
//!     is bound (once, under `v`'s own name and type) just before the first such binding. A
//!     held var that is not a dataflow var is bound so right after its held value, so the
//!     function's outputs keep their names, types and layouts (as TVM 0.27 places them).
//! - Every value is the same, element for element, as before (each rule moves elements, never
//!   computes differently), so a backend that runs every layout gives the same results.
//!   Permutes of constants are left for FoldConstant; dead bindings are removed afterwards.
//!
//! ```text
//! ; before (w a constant (64, 3, 7, 7); b a constant (1, 64, 1, 1))
//! c = R.nn.conv2d(x, w, strides=[2, 2], padding=[3, 3, 3, 3], data_layout="NCHW",
//!         kernel_layout="OIHW", out_layout="NCHW")
//! a = R.add(c, b)
//! r = R.nn.relu(a)
//! gv = R.nn.max_pool2d(r, pool_size=[3, 3], strides=[2, 2], padding=[1, 1, 1, 1],
//!         layout="NCHW", out_layout="NCHW")
//! ; after ConvertLayout(data="NHWC", kernel="OHWI")
//! x_nhwc = R.permute_dims(x, axes=[0, 2, 3, 1])
//! w_ohwi = R.permute_dims(w, axes=[0, 2, 3, 1])          ; folded by FoldConstant
//! c_nhwc = R.nn.conv2d(x_nhwc, w_ohwi, ..., data_layout="NHWC", kernel_layout="OHWI",
//!         out_layout="NHWC")
//! b_nhwc = R.permute_dims(b, axes=[0, 2, 3, 1])          ; folded by FoldConstant
//! a_nhwc = R.add(c_nhwc, b_nhwc)
//! r_nhwc = R.nn.relu(a_nhwc)
//! gv_nhwc = R.nn.max_pool2d(r_nhwc, ..., layout="NHWC", out_layout="NHWC")
//! gv = R.permute_dims(gv_nhwc, axes=[0, 3, 1, 2])
//! ```

use crate::error::{Error, Result};
use crate::ir::{Binding, Block, Callee, ExprId, ExprKind, Function, Module, Type, VarId};
use crate::op::{FusionKind, Op};
use std::collections::{HashMap, HashSet};

/// An axis permutation of a rank-4 value: axis `i` of the permuted value is axis `p[i]` of the
/// original (`permute_dims(x, axes=p)`).
type Perm = [usize; 4];

const IDENTITY: Perm = [0, 1, 2, 3];

/// Runs ConvertLayout (see the module doc) for `conv2d` with data layout `data` (a permutation
/// of `NCHW`) and kernel layout `kernel` (a permutation of `OIHW`).
pub fn convert_layout(m: &Module, data: &str, kernel: &str) -> Result<Module> {
    for (what, layout, letters) in [("data", data, "NCHW"), ("kernel", kernel, "OIHW")] {
        if perm_between(letters, layout).is_none() {
            return Err(Error::Invalid(format!(
                "ConvertLayout: the {what} layout must be a permutation of {letters}, found \
                 `{layout}`"
            )));
        }
    }
    super::substitute::rewrite_entries(m, |f| convert_in(f, data, kernel))
}

/// The permutation taking a value in layout `from` to layout `to` (both 4 distinct letters,
/// the same set): axis `i` of the result is axis `from.find(to[i])`.
fn perm_between(from: &str, to: &str) -> Option<Perm> {
    let (f, t): (Vec<char>, Vec<char>) = (from.chars().collect(), to.chars().collect());
    if f.len() != 4 || t.len() != 4 {
        return None;
    }
    let mut p = IDENTITY;
    for (i, c) in t.iter().enumerate() {
        p[i] = f.iter().position(|x| x == c)?;
    }
    let mut seen = [false; 4];
    for &a in &p {
        if std::mem::replace(&mut seen[a], true) {
            return None;
        }
    }
    Some(p)
}

/// `layout` with its axes permuted by `p` (the layout of `permute_dims(x, p)` for `x` in
/// `layout`).
fn permute_layout(layout: &str, p: Perm) -> Option<String> {
    let l: Vec<char> = layout.chars().collect();
    (l.len() == 4).then(|| p.iter().map(|&a| l[a]).collect())
}

fn inverse(p: Perm) -> Perm {
    let mut q = IDENTITY;
    for (i, &a) in p.iter().enumerate() {
        q[a] = i;
    }
    q
}

/// The permutation that takes a value held permuted by `held` to one permuted by `want`
/// (both relative to the same original).
fn between(held: Perm, want: Perm) -> Perm {
    let inv = inverse(held);
    let mut r = IDENTITY;
    for (i, &a) in want.iter().enumerate() {
        r[i] = inv[a];
    }
    r
}

fn rank_of(f: &Function, e: ExprId) -> Option<usize> {
    f.expr(e).ty.as_tensor()?.rank()
}

/// The rewrite of one function (see the module doc); says whether anything changed.
struct Converter<'a> {
    data: &'a str,
    kernel: &'a str,
    /// Held values: the var, the var holding it permuted, and the permutation.
    held: HashMap<VarId, (VarId, Perm)>,
    /// Held vars whose original is bound (again).
    bound: HashSet<VarId>,
    /// Permuted operands made in the current block: (operand, permutation) → var.
    made: HashMap<(ExprId, Perm), VarId>,
    /// The bindings of the current block, as rewritten so far.
    out: Vec<Binding>,
    /// Every var name of the function (new vars get names not in it).
    names: HashSet<String>,
    dataflow: bool,
    changed: bool,
}

impl Converter<'_> {
    /// A new var named after `base` with `suffix`, typed `ty`, bound to `value` in the block.
    fn bind_new(
        &mut self,
        f: &mut Function,
        base: VarId,
        suffix: &str,
        value: ExprId,
        ty: Type,
    ) -> VarId {
        let name = self.fresh(&format!("{}_{suffix}", f.var(base).name));
        let origin = f.var(base).origin.clone();
        let v = f.add_var_from(name, ty, self.dataflow, origin);
        self.out.push(Binding { var: v, value });
        v
    }

    /// `base`, or `base` with a number, not yet a var name of the function (then taken).
    fn fresh(&mut self, base: &str) -> String {
        let name = super::outline::unique_name(base, &|n| self.names.contains(n));
        self.names.insert(name.clone());
        name
    }

    /// `permute_dims(e, axes=p)`, typed by inference.
    fn permute(&mut self, f: &mut Function, e: ExprId, p: Perm) -> Option<ExprId> {
        let op = Op::PermuteDims {
            axes: Some(p.iter().map(|&a| a as i64).collect()),
        };
        let ty = op.infer(&[&f.expr(e).ty]).ok()?;
        Some(f.add_expr(
            ExprKind::Call {
                callee: Callee::Op(op),
                args: vec![e],
            },
            ty,
        ))
    }

    /// Operand `e` (rank 4) permuted by `want` relative to its original value: the held var as
    /// it is, or one `permute_dims` of it or of `e` (made once per block).
    fn operand(&mut self, f: &mut Function, e: ExprId, want: Perm, suffix: &str) -> Option<ExprId> {
        let (src, perm) = match f.as_var(e).and_then(|v| self.held.get(&v).copied()) {
            Some((h, p)) => (f.var(h).expr, between(p, want)),
            None => (e, want),
        };
        if perm == IDENTITY {
            return Some(src);
        }
        if let Some(&v) = self.made.get(&(src, perm)) {
            return Some(f.var(v).expr);
        }
        let value = self.permute(f, src, perm)?;
        let ty = f.expr(value).ty.clone();
        let base = f.as_var(e).or_else(|| f.as_var(src));
        let v = match base {
            Some(b) => self.bind_new(f, b, suffix, value, ty),
            None => {
                // A constant operand: named after nothing in particular.
                let name = self.fresh(&format!("const_{suffix}"));
                let v = f.add_var(name, ty, self.dataflow);
                self.out.push(Binding { var: v, value });
                v
            }
        };
        self.made.insert((src, perm), v);
        Some(f.var(v).expr)
    }

    /// Binds the original of held var `v` (`v = permute_dims(v', inverse(p))`) unless it is.
    fn restore(&mut self, f: &mut Function, v: VarId) {
        let Some(&(h, p)) = self.held.get(&v) else {
            return;
        };
        if !self.bound.insert(v) {
            return;
        }
        let op = Op::PermuteDims {
            axes: Some(inverse(p).iter().map(|&a| a as i64).collect()),
        };
        let value = f.add_expr(
            ExprKind::Call {
                callee: Callee::Op(op),
                args: vec![f.var(h).expr],
            },
            f.var(v).ty.clone(),
        );
        self.out.push(Binding { var: v, value });
    }

    /// The perm a held var operand of `args` has (the first one).
    fn held_perm(&self, f: &Function, args: &[ExprId]) -> Option<Perm> {
        args.iter()
            .find_map(|&a| f.as_var(a).and_then(|v| self.held.get(&v)).map(|&(_, p)| p))
    }

    /// Rewrites binding `b` if a rule applies: the new value's var held for `b.var`.
    fn rewrite(&mut self, f: &mut Function, b: Binding) -> Option<()> {
        // `y = v` of a held `v`: `y` is held as `v` is (no binding; restored where needed).
        if let ExprKind::Var(v) = f.expr(b.value).kind
            && let Some(&h) = self.held.get(&v)
        {
            self.held.insert(b.var, h);
            self.changed = true;
            return Some(());
        }
        let ExprKind::Call {
            callee: Callee::Op(op),
            args,
        } = f.expr(b.value).kind.clone()
        else {
            return None;
        };
        let suffix = self.data.to_lowercase();
        let (new_op, new_args, perm) = match &op {
            Op::Conv2d(a) => {
                let (&x, &w) = (args.first()?, args.get(1)?);
                if rank_of(f, x)? != 4 || rank_of(f, w)? != 4 {
                    return None;
                }
                if a.data_layout == self.data
                    && a.kernel_layout == self.kernel
                    && a.out_layout == self.data
                {
                    return None;
                }
                let px = perm_between(&a.data_layout, self.data)?;
                let pw = perm_between(&a.kernel_layout, self.kernel)?;
                let po = perm_between(&a.out_layout, self.data)?;
                let x2 = self.operand(f, x, px, &suffix)?;
                let w2 = self.operand(f, w, pw, &self.kernel.to_lowercase())?;
                let mut a2 = (**a).clone();
                a2.data_layout = self.data.to_string();
                a2.kernel_layout = self.kernel.to_string();
                a2.out_layout = self.data.to_string();
                let mut rest = vec![x2, w2];
                rest.extend_from_slice(&args[2..]);
                (Op::Conv2d(Box::new(a2)), rest, po)
            }
            Op::MaxPool2d(_) | Op::AvgPool2d(_) | Op::AdaptiveAvgPool2d(_) => {
                let x = *args.first()?;
                let &(h, p) = self.held.get(&f.as_var(x)?)?;
                let mut new_op = op.clone();
                let (layout, out_layout) = match &mut new_op {
                    Op::MaxPool2d(a) | Op::AvgPool2d(a) => (&mut a.layout, &mut a.out_layout),
                    Op::AdaptiveAvgPool2d(a) => (&mut a.layout, &mut a.out_layout),
                    _ => return None,
                };
                *layout = permute_layout(layout, p)?;
                *out_layout = permute_layout(out_layout, p)?;
                let mut rest = vec![f.var(h).expr];
                rest.extend_from_slice(&args[1..]);
                (new_op, rest, p)
            }
            _ if op.fusion_kind() == FusionKind::ElemWise
                && !matches!(op, Op::Tril { .. } | Op::Triu { .. }) =>
            {
                let x = *args.first()?;
                let &(h, p) = self.held.get(&f.as_var(x)?)?;
                let mut rest = vec![f.var(h).expr];
                rest.extend_from_slice(&args[1..]);
                (op.clone(), rest, p)
            }
            _ if op.fusion_kind() == FusionKind::Broadcast && !matches!(op, Op::BroadcastTo) => {
                if f.var(b.var).ty.as_tensor()?.rank()? != 4 {
                    return None;
                }
                let p = self.held_perm(f, &args)?;
                let mut rest = Vec::with_capacity(args.len());
                for &a in &args {
                    let r = rank_of(f, a)?;
                    let e = match r {
                        0 => a,
                        4 => self.operand(f, a, p, &suffix)?,
                        1..=3 => {
                            // Leading unit axes first (what broadcasting gives it), then permute.
                            let op = Op::ExpandDims {
                                axis: (0..(4 - r) as i64).collect(),
                            };
                            let ty = op.infer(&[&f.expr(a).ty]).ok()?;
                            let value = f.add_expr(
                                ExprKind::Call {
                                    callee: Callee::Op(op),
                                    args: vec![a],
                                },
                                ty.clone(),
                            );
                            let base = f.as_var(a).unwrap_or(b.var);
                            let v = self.bind_new(f, base, "4d", value, ty);
                            let e4 = f.var(v).expr;
                            self.operand(f, e4, p, &suffix)?
                        }
                        _ => return None,
                    };
                    rest.push(e);
                }
                (op.clone(), rest, p)
            }
            _ => return None,
        };
        let arg_tys: Vec<Type> = new_args.iter().map(|&a| f.expr(a).ty.clone()).collect();
        let tys: Vec<&Type> = arg_tys.iter().collect();
        let ty = new_op.infer(&tys).ok()?;
        let value = f.add_expr(
            ExprKind::Call {
                callee: Callee::Op(new_op),
                args: new_args,
            },
            ty.clone(),
        );
        let v = self.bind_new(f, b.var, &suffix, value, ty);
        self.held.insert(b.var, (v, perm));
        self.changed = true;
        Some(())
    }
}

/// Rewrites `f` (see the module doc); says whether anything changed.
fn convert_in(f: &mut Function, data: &str, kernel: &str) -> bool {
    let blocks = std::mem::take(&mut f.blocks);
    let mut c = Converter {
        data,
        kernel,
        held: HashMap::new(),
        bound: HashSet::new(),
        made: HashMap::new(),
        out: Vec::new(),
        names: f.vars.iter().map(|(_, v)| v.name.clone()).collect(),
        dataflow: false,
        changed: false,
    };
    for block in blocks {
        c.dataflow = block.dataflow;
        c.made.clear();
        for b in &block.bindings {
            // A rule that fails half way leaves only unused bindings behind (removed as dead
            // code) and falls back to the binding as it is.
            if c.rewrite(f, *b).is_some() {
                // A var visible after the block is bound in its original layout right away.
                if !f.var(b.var).dataflow {
                    c.restore(f, b.var);
                }
                continue;
            }
            let mut reads = Vec::new();
            crate::ir::for_each_use(f, b.value, &mut |v| reads.push(v));
            for v in reads {
                c.restore(f, v);
            }
            c.out.push(*b);
        }
        for b in &block.bindings {
            if !f.var(b.var).dataflow {
                c.restore(f, b.var);
            }
        }
        f.blocks.push(Block {
            dataflow: block.dataflow,
            bindings: std::mem::take(&mut c.out),
        });
        // A dataflow var does not outlive its block: later blocks read the originals (bound
        // again above for every var that outlives it).
        c.held.retain(|_, &mut (h, _)| !f.var(h).dataflow);
    }
    c.changed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::{parse_module_str, print_module};

    fn run(src: &str, data: &str, kernel: &str) -> String {
        let m = parse_module_str(src).unwrap_or_else(|e| panic!("{e}"));
        let out = convert_layout(&m, data, kernel).unwrap_or_else(|e| panic!("{e}"));
        crate::ir::verify::verify(&out)
            .unwrap_or_else(|e| panic!("{e:?}\n{}", print_module(&out).text));
        print_module(&out).text
    }

    #[test]
    fn permutations_compose() {
        let p = perm_between("NCHW", "NHWC").unwrap();
        assert_eq!(p, [0, 2, 3, 1]);
        assert_eq!(inverse(p), [0, 3, 1, 2]);
        assert_eq!(permute_layout("NCHW", p).unwrap(), "NHWC");
        // Held as NHWC, wanted as NWHC (relative to the NCHW original).
        let want = perm_between("NCHW", "NWHC").unwrap();
        let r = between(p, want);
        assert_eq!(permute_layout("NHWC", r).unwrap(), "NWHC");
        assert!(perm_between("NCHW", "NCHH").is_none());
        assert!(perm_between("NCHW", "NCH").is_none());
    }

    #[test]
    fn a_layout_that_is_not_a_permutation_is_an_error() {
        let m = parse_module_str(CHAIN).unwrap_or_else(|e| panic!("{e}"));
        let e = convert_layout(&m, "NHWX", "OHWI").unwrap_err().to_string();
        assert!(
            e.contains("permutation of NCHW") && e.contains("NHWX"),
            "{e}"
        );
        let e = convert_layout(&m, "NHWC", "OIH").unwrap_err().to_string();
        assert!(e.contains("permutation of OIHW"), "{e}");
    }

    const CHAIN: &str = r#"
@I.ir_module
class Module:
    @R.function
    def main(x: R.Tensor((1, 3, 8, 8), dtype="float32"), w: R.Tensor((4, 3, 3, 3), dtype="float32"), b: R.Tensor((1, 4, 1, 1), dtype="float32"), c: R.Tensor((4, 1, 1), dtype="float32")) -> R.Tensor((1, 4, 1, 1), dtype="float32"):
        with R.dataflow():
            lv: R.Tensor((1, 4, 8, 8), dtype="float32") = R.nn.conv2d(x, w, strides=[1, 1], padding=[1, 1, 1, 1], dilation=[1, 1], groups=1, data_layout="NCHW", kernel_layout="OIHW", out_layout="NCHW", out_dtype="void")
            lv1: R.Tensor((1, 4, 8, 8), dtype="float32") = R.add(lv, b)
            lv2: R.Tensor((1, 4, 8, 8), dtype="float32") = R.multiply(c, lv1)
            lv3: R.Tensor((1, 4, 8, 8), dtype="float32") = R.clip(lv2, R.prim_value(0), R.prim_value(6))
            lv4: R.Tensor((1, 4, 8, 8), dtype="float32") = R.add(lv3, lv)
            gv: R.Tensor((1, 4, 1, 1), dtype="float32") = R.nn.adaptive_avg_pool2d(lv4, output_size=[1, 1], layout="NCHW", out_layout="NCHW")
            R.output(gv)
        return gv
"#;

    #[test]
    fn the_layout_travels_through_elementwise_ops_and_pools_to_one_permute_back() {
        let out = run(CHAIN, "NHWC", "OHWI");
        let expect = [
            "x_nhwc: R.Tensor((1, 8, 8, 3), dtype=\"float32\") = R.permute_dims(x, axes=[0, 2, 3, 1])",
            "w_ohwi: R.Tensor((4, 3, 3, 3), dtype=\"float32\") = R.permute_dims(w, axes=[0, 2, 3, 1])",
            "data_layout=\"NHWC\", kernel_layout=\"OHWI\", out_layout=\"NHWC\"",
            "b_nhwc: R.Tensor((1, 1, 1, 4), dtype=\"float32\") = R.permute_dims(b, axes=[0, 2, 3, 1])",
            "c_4d: R.Tensor((1, 4, 1, 1), dtype=\"float32\") = R.expand_dims(c, axis=[0])",
            "lv4_nhwc: R.Tensor((1, 8, 8, 4), dtype=\"float32\") = R.add(lv3_nhwc, lv_nhwc)",
            "layout=\"NHWC\", out_layout=\"NHWC\"",
            "gv: R.Tensor((1, 4, 1, 1), dtype=\"float32\") = R.permute_dims(gv_nhwc, axes=[0, 3, 1, 2])",
        ];
        for e in expect {
            assert!(out.contains(e), "missing `{e}` in\n{out}");
        }
        // One permute back (the output), none in the middle.
        assert_eq!(out.matches("axes=[0, 3, 1, 2]").count(), 1, "{out}");
    }

    #[test]
    fn an_op_that_needs_the_original_layout_gets_it_back_once() {
        // Two reshapes read `lv1`; the output (a reshape back) is in the original layout.
        let src = r#"
@I.ir_module
class Module:
    @R.function
    def main(x: R.Tensor((1, 3, 8, 8), dtype="float32"), w: R.Tensor((4, 3, 3, 3), dtype="float32")) -> R.Tensor((1, 4, 8, 8), dtype="float32"):
        with R.dataflow():
            lv: R.Tensor((1, 4, 8, 8), dtype="float32") = R.nn.conv2d(x, w, strides=[1, 1], padding=[1, 1, 1, 1], dilation=[1, 1], groups=1, data_layout="NCHW", kernel_layout="OIHW", out_layout="NCHW", out_dtype="void")
            lv1: R.Tensor((1, 4, 8, 8), dtype="float32") = R.nn.relu(lv)
            lv2: R.Tensor((1, 256), dtype="float32") = R.reshape(lv1, R.shape([1, 256]))
            lv3: R.Tensor((1, 256), dtype="float32") = R.reshape(lv1, R.shape([1, 256]))
            lv4: R.Tensor((1, 256), dtype="float32") = R.add(lv2, lv3)
            gv: R.Tensor((1, 4, 8, 8), dtype="float32") = R.reshape(lv4, R.shape([1, 4, 8, 8]))
            R.output(gv)
        return gv
"#;
        let out = run(src, "NHWC", "OHWI");
        assert!(
            out.contains("lv1: R.Tensor((1, 4, 8, 8), dtype=\"float32\") = R.permute_dims(lv1_nhwc, axes=[0, 3, 1, 2])"),
            "{out}"
        );
        assert_eq!(out.matches("R.permute_dims(lv1_nhwc").count(), 1, "{out}");
        assert!(out.contains("R.reshape(lv1, R.shape([1, 256]))"), "{out}");
        assert!(
            out.contains("lv4: R.Tensor((1, 256), dtype=\"float32\") = R.add(lv2, lv3)"),
            "{out}"
        );
    }

    #[test]
    fn a_later_block_reads_the_original_of_a_value_held_in_a_dataflow_var() {
        let src = r#"
@I.ir_module
class Module:
    @R.function
    def main(x: R.Tensor((1, 3, 8, 8), dtype="float32"), w: R.Tensor((3, 3, 3, 3), dtype="float32")) -> R.Tensor((1, 3, 8, 8), dtype="float32"):
        with R.dataflow():
            lv: R.Tensor((1, 3, 8, 8), dtype="float32") = R.nn.conv2d(x, w, strides=[1, 1], padding=[1, 1, 1, 1], dilation=[1, 1], groups=1, data_layout="NCHW", kernel_layout="OIHW", out_layout="NCHW", out_dtype="void")
            gv: R.Tensor((1, 3, 8, 8), dtype="float32") = R.nn.relu(lv)
            R.output(gv)
        with R.dataflow():
            lv1: R.Tensor((1, 3, 8, 8), dtype="float32") = R.nn.conv2d(gv, w, strides=[1, 1], padding=[1, 1, 1, 1], dilation=[1, 1], groups=1, data_layout="NCHW", kernel_layout="OIHW", out_layout="NCHW", out_dtype="void")
            gv1: R.Tensor((1, 3, 8, 8), dtype="float32") = R.add(lv1, gv)
            R.output(gv1)
        return gv1
"#;
        // `run` verifies: no dataflow var of the first block is read in the second.
        let out = run(src, "NHWC", "OHWI");
        assert!(
            out.contains("gv_nhwc1: R.Tensor((1, 8, 8, 3), dtype=\"float32\") = R.permute_dims(gv, axes=[0, 2, 3, 1])"),
            "{out}"
        );
        assert!(
            out.contains("gv1: R.Tensor((1, 3, 8, 8), dtype=\"float32\") = R.permute_dims("),
            "{out}"
        );
    }

    #[test]
    fn a_conv_already_in_the_desired_layouts_is_left_alone() {
        let src = r#"
@I.ir_module
class Module:
    @R.function
    def main(x: R.Tensor((1, 8, 8, 3), dtype="float32"), w: R.Tensor((4, 3, 3, 3), dtype="float32")) -> R.Tensor((1, 8, 8, 4), dtype="float32"):
        with R.dataflow():
            gv: R.Tensor((1, 8, 8, 4), dtype="float32") = R.nn.conv2d(x, w, strides=[1, 1], padding=[1, 1, 1, 1], dilation=[1, 1], groups=1, data_layout="NHWC", kernel_layout="OHWI", out_layout="NHWC", out_dtype="void")
            R.output(gv)
        return gv
"#;
        let m = parse_module_str(src).unwrap_or_else(|e| panic!("{e}"));
        let out = convert_layout(&m, "NHWC", "OHWI").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(print_module(&out).text, print_module(&m).text);
    }
}
