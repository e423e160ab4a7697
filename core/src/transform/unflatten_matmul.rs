//! UnflattenMatmul: the reshapes exporters put around a dense layer's GEMM (`torch.addmm` on a
//! flattened `[B * S, K]` view, then the view back to `[B, S, N]`) are removed, so the
//! `matmul` reads the `[B, S, K]` activation and writes the `[B, S, N]` result directly.
//!
//! Contract:
//!
//! - **Requires** a module that verifies.
//! - **Rewrites**, in every function without `Primitive`, `Composite` or `Codegen`, each binding
//!   `y = R.reshape(m, _)` or `y = R.reshape(R.add(m, b), _)` (either operand order; `b` a
//!   bias of one value per column or a scalar: rank ≤ 2, every dim but the last 1, the last
//!   `N` or 1, and the add's type the product's) where `m = R.matmul(x2, w)` (no
//!   `out_dtype`, or `out_dtype` equal to the result's dtype), `x2 = R.reshape(x, _)`, and:
//!   - `w` has rank 2 (`[K, N]`), `x2` rank 2 (`[R, K]`), `x` rank ≥ 2 with the same last dim
//!     `K` (by expression: a symbolic dim by name), so the rows of `x2` are the rows of `x`,
//!     in row-major order;
//!   - `y`'s dims are `x`'s dims with the last replaced by `N`, and its dtype is `m`'s.
//!
//!   Then `y = R.matmul(x, w)` (matmul broadcasts a rank-2 weight over `x`'s leading dims), or
//!   with the bias `m' = R.matmul(x, w)` (a new var, named `<m>_unflat`, bound just before)
//!   and `y = R.add(m', b)`: every element of `y` is the same dot product of the same row of
//!   `x` and column of `w`, plus the same bias element.
//!   With the CPU backend the bits are the same too: it runs a product with a rank-2 weight as
//!   one GEMM over the flattened rows of `x`, which is the flattened product.
//! - `m` and `x2` keep their bindings while something else reads them; otherwise dead code
//!   elimination removes them. Types, names and origins of the remaining bindings are kept.
//!   Anything else is left as it is.
//!
//! ```text
//! ; before (x: [b, s, 768], W: [768, 3072] constant)
//! v = R.reshape(x, R.shape([b * s, 768]))
//! m = R.matmul(v, W, out_dtype=None)
//! y = R.reshape(m, R.shape([b, s, 3072]))
//! ; after
//! y = R.matmul(x, W, out_dtype=None)
//!
//! ; before, with the bias of `torch.addmm` (c: [3072] constant)
//! v = R.reshape(x, R.shape([b * s, 768]))
//! m = R.matmul(v, W, out_dtype=None)
//! a = R.add(m, c)
//! y = R.reshape(a, R.shape([b, s, 3072]))
//! ; after
//! m_unflat = R.matmul(x, W, out_dtype=None)
//! y = R.add(m_unflat, c)
//! ```

use super::substitute::{call_of, rebind};
use crate::error::Result;
use crate::ir::{Binding, Callee, ExprId, ExprKind, Function, Module, Type, VarId};
use crate::op::Op;
use crate::pattern::matcher::FunctionView;

/// Runs UnflattenMatmul (see the module doc); inside the branches of `if`s too (see
/// [`super::regions`]).
pub fn unflatten_matmul(m: &Module) -> Result<Module> {
    super::substitute::rewrite_entries(m, unflatten_in)
}

/// What a site becomes.
struct Site {
    /// The outer reshape's var: rebound to the product (or to the bias add of it).
    y: VarId,
    /// The activation `[..., K]`.
    x: ExprId,
    /// The weight `[K, N]`.
    w: ExprId,
    /// The matmul callee (with its attributes).
    callee: Callee,
    /// The bias add: its other operand, and whether the product was its first operand.
    bias: Option<(ExprId, bool)>,
    /// The product's var (named after, for the new var of the biased form).
    m: VarId,
}

/// Whether `b` (a bias added to a rank-2 `[R, N]` product) is per column or a scalar: every
/// dim but the last is 1, the last `N` or 1, rank at most 2.
fn per_column(f: &Function, b: ExprId, n: &crate::ir::Dim) -> bool {
    let Some(dims) = f.expr(b).ty.as_tensor().and_then(|t| t.dims.as_deref()) else {
        return false;
    };
    let one = crate::ir::Dim::Static(1);
    dims.len() <= 2
        && dims.split_last().is_none_or(|(last, rest)| {
            (last == n || *last == one) && rest.iter().all(|d| *d == one)
        })
}

/// The site the binding `y = reshape(a, _)` is, if it is one (see the module doc).
fn site(view: &FunctionView<'_>, f: &Function, y: VarId, value: ExprId) -> Option<Site> {
    let ExprKind::Call {
        callee: Callee::Op(Op::Reshape),
        args,
    } = &f.expr(value).kind
    else {
        return None;
    };
    let a = *args.first()?;
    // The reshaped value: the product, or the product plus a bias.
    let (m, bias) = match call_of(view, f, a)? {
        (Op::Matmul { .. }, _) => (a, None),
        (Op::Add, [p, q]) => {
            let is_mm = |e: ExprId| matches!(call_of(view, f, e), Some((Op::Matmul { .. }, _)));
            if is_mm(*p) {
                (*p, Some((*q, true)))
            } else if is_mm(*q) {
                (*q, Some((*p, false)))
            } else {
                return None;
            }
        }
        _ => return None,
    };
    let (op @ Op::Matmul { out_dtype }, [x2, w]) = call_of(view, f, m)? else {
        return None;
    };
    let (Op::Reshape, [x, _]) = call_of(view, f, *x2)? else {
        return None;
    };
    let tensor = |e: ExprId| f.expr(e).ty.as_tensor();
    let (xt, x2t, wt, mt, at) = (
        tensor(*x)?,
        tensor(*x2)?,
        tensor(*w)?,
        tensor(m)?,
        tensor(a)?,
    );
    let yt = f.var(y).ty.as_tensor()?;
    let (xd, x2d, wd, yd) = (
        xt.dims.as_deref()?,
        x2t.dims.as_deref()?,
        wt.dims.as_deref()?,
        yt.dims.as_deref()?,
    );
    if wd.len() != 2 || x2d.len() != 2 || xd.len() < 2 || yd.len() != xd.len() {
        return None;
    }
    let (k, n) = (&wd[0], &wd[1]);
    let same_k = xd.last() == Some(k) && x2d.last() == Some(k);
    let same_rows = xd[..xd.len() - 1] == yd[..yd.len() - 1] && yd.last() == Some(n);
    let dtype_ok = mt.dtype.is_some()
        && yt.dtype == mt.dtype
        && at.dtype == mt.dtype
        && out_dtype.is_none_or(|d| Some(d) == mt.dtype)
        && xt.dtype == x2t.dtype;
    // The bias add keeps the product's shape (no broadcast beyond it).
    let bias_ok = bias.is_none_or(|(b, _)| at.dims == mt.dims && per_column(f, b, n));
    (same_k && same_rows && dtype_ok && bias_ok).then(|| Site {
        y,
        x: *x,
        w: *w,
        callee: Callee::Op(op.clone()),
        bias,
        m: f.as_var(m).unwrap_or(y),
    })
}

/// Rewrites every site of `f`; says whether anything changed.
fn unflatten_in(f: &mut Function) -> bool {
    let sites: Vec<Site> = {
        let view = FunctionView::new(f);
        f.bindings()
            .filter_map(|b| site(&view, f, b.var, b.value))
            .collect()
    };
    let changed = !sites.is_empty();
    for s in sites {
        let ty: Type = f.var(s.y).ty.clone();
        let product = f.add_expr(
            ExprKind::Call {
                callee: s.callee,
                args: vec![s.x, s.w],
            },
            ty.clone(),
        );
        let Some((b, product_first)) = s.bias else {
            rebind(f, s.y, product, None);
            continue;
        };
        // The biased form: `m' = matmul(x, w)` bound just before `y = add(m', b)`.
        let base = format!("{}_unflat", f.var(s.m).name);
        let name = super::outline::unique_name(&base, &|n| f.vars.iter().any(|(_, v)| v.name == n));
        let dataflow = f.var(s.y).dataflow;
        let origin = f.var(s.m).origin.clone();
        let mv = f.add_var_from(name, ty.clone(), dataflow, origin);
        let mref = f.var(mv).expr;
        let args = if product_first {
            vec![mref, b]
        } else {
            vec![b, mref]
        };
        let add = f.add_expr(
            ExprKind::Call {
                callee: Callee::Op(Op::Add),
                args,
            },
            ty,
        );
        rebind(
            f,
            s.y,
            add,
            Some(Binding {
                var: mv,
                value: product,
            }),
        );
    }
    changed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::{parse_module_str, print_module};

    fn run(src: &str) -> String {
        let m = parse_module_str(src).unwrap_or_else(|e| panic!("{e}"));
        let out = unflatten_matmul(&m).unwrap_or_else(|e| panic!("{e}"));
        crate::ir::verify::verify(&out).unwrap_or_else(|e| panic!("{e:?}"));
        print_module(&out).text
    }

    const FLAT: &str = r#"
@I.ir_module
class Module:
    @R.function
    def main(x: R.Tensor((b, s, 8), dtype="float32"), w: R.Tensor((8, 4), dtype="float32")) -> R.Tensor((b, s, 4), dtype="float32"):
        with R.dataflow():
            v: R.Tensor((b * s, 8), dtype="float32") = R.reshape(x, R.shape([b * s, 8]))
            m: R.Tensor((b * s, 4), dtype="float32") = R.matmul(v, w, out_dtype="void")
            y: R.Tensor((b, s, 4), dtype="float32") = R.reshape(m, R.shape([b, s, 4]))
            gv: R.Tensor((b, s, 4), dtype="float32") = R.nn.relu(y)
            R.output(gv)
        return gv
"#;

    #[test]
    fn the_flattening_reshapes_around_a_dense_gemm_go() {
        let out = run(FLAT);
        assert!(
            out.contains("y: R.Tensor((b, s, 4), dtype=\"float32\") = R.matmul(x, w"),
            "{out}"
        );
        assert!(!out.contains("R.reshape"), "{out}");
    }

    #[test]
    fn a_per_column_bias_moves_after_the_unflattened_product() {
        let src = FLAT
            .replace(
                "y: R.Tensor((b, s, 4), dtype=\"float32\") = R.reshape(m, R.shape([b, s, 4]))",
                "a: R.Tensor((b * s, 4), dtype=\"float32\") = R.add(c, m)\n            y: R.Tensor((b, s, 4), dtype=\"float32\") = R.reshape(a, R.shape([b, s, 4]))",
            )
            .replace(
                "w: R.Tensor((8, 4), dtype=\"float32\")",
                "w: R.Tensor((8, 4), dtype=\"float32\"), c: R.Tensor((4,), dtype=\"float32\")",
            );
        let out = run(&src);
        assert!(
            out.contains("m_unflat: R.Tensor((b, s, 4), dtype=\"float32\") = R.matmul(x, w"),
            "{out}"
        );
        assert!(
            out.contains("y: R.Tensor((b, s, 4), dtype=\"float32\") = R.add(c, m_unflat)"),
            "{out}"
        );
        assert!(!out.contains("R.reshape"), "{out}");
        // A bias per row is not moved: it would broadcast differently.
        let rows = src.replace(
            "c: R.Tensor((4,), dtype=\"float32\")",
            "c: R.Tensor((b * s, 1), dtype=\"float32\")",
        );
        let out = run(&rows);
        assert!(out.contains("R.reshape(a"), "{out}");
    }

    #[test]
    fn a_reshape_that_regroups_rows_or_flattens_k_is_kept() {
        // The result is [s, b, 4]: not x's leading dims.
        let src = FLAT
            .replace("(b, s, 4)", "(s, b, 4)")
            .replace("[b, s, 4]", "[s, b, 4]");
        let out = run(&src);
        assert!(out.contains("R.reshape(m"), "{out}");
        // A flattened K: x is [b, s, 2, 4], reshaped to [b * s, 8].
        let src = FLAT.replace(
            "x: R.Tensor((b, s, 8), dtype=\"float32\")",
            "x: R.Tensor((b, s, 2, 4), dtype=\"float32\")",
        );
        let out = run(&src);
        assert!(out.contains("R.reshape(x"), "{out}");
        assert!(out.contains("R.reshape(m"), "{out}");
    }

    #[test]
    fn the_intermediates_stay_while_something_else_reads_them() {
        let src = FLAT
            .replace(
                "gv: R.Tensor((b, s, 4), dtype=\"float32\") = R.nn.relu(y)\n            R.output(gv)\n        return gv",
                "gv: R.Tensor((b, s, 4), dtype=\"float32\") = R.nn.relu(y)\n            gv1: R.Tuple(R.Tensor((b, s, 4), dtype=\"float32\"), R.Tensor((b * s, 4), dtype=\"float32\")) = (gv, m)\n            R.output(gv1)\n        return gv1",
            )
            .replace(
                "-> R.Tensor((b, s, 4), dtype=\"float32\"):",
                "-> R.Tuple(R.Tensor((b, s, 4), dtype=\"float32\"), R.Tensor((b * s, 4), dtype=\"float32\")):",
            );
        let out = run(&src);
        assert!(out.contains("= R.matmul(x, w"), "{out}");
        assert!(out.contains("= R.matmul(v, w"), "{out}");
    }
}
