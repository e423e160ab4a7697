//! EinsumToMatmul: an `einsum` of an activation and a constant weight that is a dense layer
//! (XLNet's projections, `ibh,hnd->ibnd` and `ibnd,hnd->ibh`) becomes a `matmul` with a
//! rank-2 constant weight, between reshapes (and transposes where the labels ask for them), so
//! the weight is rearranged once here instead of on every call, backends see the dense layer
//! their patterns and weight packing are made for, and a bias or activation after it can join
//! it.
//!
//! Contract:
//!
//! - **Requires** a module that verifies.
//! - **Rewrites**, in every function without `Primitive`, `Composite` or `Codegen`, each binding
//!   `y = R.einsum((a, b), subscripts=s)` where exactly one operand, `w`, is a constant (after
//!   FoldConstant: a weight), the other, `x`, is not, both have the same float dtype and known
//!   rank, `y`'s dims are known, and the labels split as a dense layer's: no label repeats
//!   within an operand, every label of `x` is an output label (a *row*) or shared with `w` (a
//!   *contracted* label), every label of `w` is an output label (a *column*) or contracted,
//!   no label is in both operands and the output (a batch label), and there is at least one
//!   row, one column and one contracted label. Each contracted dim of `x` must be a known
//!   integer equal to `w`'s (no broadcast). Then, with `R` the rows and `K` the contracted
//!   labels in `x`'s order and `C` the columns in `w`'s order:
//!
//!   `y = permute(reshape(matmul(reshape(permute(x, R ++ K), R ++ [|K|]), W2), R ++ C), out)`
//!
//!   where `W2 = reshape(permute(w, K ++ C), [|K|, |C|])` is computed here (a new constant,
//!   `w`'s elements moved bit for bit), and each `permute` or `reshape` that changes nothing is
//!   left out. Every element of `y` is the same sum of products (the order of the sum is the
//!   kernel's, as the einsum's own matmul path). `y` keeps its var (name, type, origin); the
//!   new vars are named after it (`<y>_x`, `<y>_flat`, `<y>_mm`, `<y>_cols`).
//! - An einsum of two activations (attention's `ibnd,jbnd->bnij`, which the attention
//!   patterns read as an einsum) and every other binding are left as they are.
//!
//! ```text
//! ; before (x: [s, b, 1024]; W: [1024, 16, 64] constant)
//! q = R.einsum((x, W), subscripts="ibh,hnd->ibnd")
//! ; after
//! q_mm = R.matmul(x, metadata["relax.expr.Constant"][0], out_dtype=None)   ; W as [1024, 1024]
//! q = R.reshape(q_mm, R.shape([s, b, 16, 64]))
//!
//! ; before (a: [s, b, 16, 64]; O: [1024, 16, 64] constant)
//! o = R.einsum((a, O), subscripts="ibnd,hnd->ibh")
//! ; after
//! o_flat = R.reshape(a, R.shape([s, b, 1024]))
//! o = R.matmul(o_flat, metadata["relax.expr.Constant"][1], out_dtype=None)  ; O as [n·d, h]
//! ```

use super::substitute::{ChainCall, bind_chain, shape_arg};
use crate::error::Result;
use crate::ir::{Callee, Constant, DType, Dim, ExprId, ExprKind, Function, Module, Type, VarId};
use crate::op::Op;
use crate::op::einsum::EinsumSpec;
use crate::pattern::matcher::FunctionView;

/// Runs EinsumToMatmul (see the module doc); inside the branches of `if`s too (see
/// [`super::regions`]).
pub fn einsum_to_matmul(m: &Module) -> Result<Module> {
    super::substitute::rewrite_entries(m, rewrite_in)
}

/// What a site becomes.
struct Site {
    /// The einsum's var: rebound to the last call.
    y: VarId,
    /// The activation.
    x: ExprId,
    /// `x`'s permutation to rows then contracted labels (`None`: already in that order).
    x_perm: Option<Vec<usize>>,
    /// The rows' dims, from `x`'s type, in `x`'s order.
    rows: Vec<Dim>,
    /// How many labels are contracted, and the product of their extents.
    contracted: (usize, i64),
    /// The weight as `[|K|, |C|]`.
    w2: Constant,
    /// The columns' extents, in `w`'s order.
    cols: Vec<i64>,
    /// The permutation from rows ++ columns to `y`'s order (`None`: the same).
    out_perm: Option<Vec<usize>>,
    dtype: DType,
}

/// `Some(p)` unless `p` is the identity.
fn non_identity(p: Vec<usize>) -> Option<Vec<usize>> {
    (!p.iter().enumerate().all(|(i, &a)| i == a)).then_some(p)
}

/// `c` permuted by `perm` (result dim `i` is `c`'s dim `perm[i]`), element bytes moved as
/// they are; `None` if `perm` does not fit `c`.
fn permute_constant(c: &Constant, perm: &[usize]) -> Option<Constant> {
    let r = c.shape.len();
    if perm.len() != r {
        return None;
    }
    let shape: Vec<usize> = c
        .shape
        .iter()
        .map(|&d| usize::try_from(d).ok())
        .collect::<Option<_>>()?;
    let es = c.dtype.size_bytes();
    let n: usize = shape.iter().product();
    if c.data.len() != n.checked_mul(es)? {
        return None;
    }
    let mut strides = vec![1usize; r];
    for i in (0..r.saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * shape[i + 1];
    }
    let out_shape: Vec<usize> = perm
        .iter()
        .map(|&p| shape.get(p).copied())
        .collect::<Option<_>>()?;
    let out_strides: Vec<usize> = perm.iter().map(|&p| strides[p]).collect();
    let mut data = Vec::with_capacity(c.data.len());
    let mut idx = vec![0usize; r];
    for _ in 0..n {
        let src: usize = idx.iter().zip(&out_strides).map(|(i, s)| i * s).sum();
        data.extend_from_slice(&c.data[src * es..(src + 1) * es]);
        // The next destination index, last dim fastest.
        for d in (0..r).rev() {
            idx[d] += 1;
            if idx[d] < out_shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    let shape = out_shape.iter().map(|&d| d as i64).collect();
    Constant::from_bytes(c.dtype, shape, data).ok()
}

/// The site the binding `y = einsum(...)` is, if it is one (see the module doc).
fn site(view: &FunctionView<'_>, f: &Function, y: VarId, value: ExprId) -> Option<Site> {
    let ExprKind::Call {
        callee: Callee::Op(Op::Einsum { subscripts }),
        args,
    } = &f.expr(value).kind
    else {
        return None;
    };
    let [tuple] = args.as_slice() else {
        return None;
    };
    let ExprKind::Tuple(ops) = &f.expr(view.unwrap(*tuple, usize::MAX)).kind else {
        return None;
    };
    let [a, b] = ops.as_slice() else {
        return None;
    };
    let constant = |e: ExprId| match &f.expr(view.unwrap(e, usize::MAX)).kind {
        ExprKind::Const(c) => Some(c),
        _ => None,
    };
    let (xi, x, w) = match (constant(*a), constant(*b)) {
        (None, Some(w)) => (0, *a, w),
        (Some(w), None) => (1, *b, w),
        _ => return None,
    };
    let xt = f.expr(x).ty.as_tensor()?;
    let xd = xt.dims.as_deref()?;
    let dtype = xt.dtype?;
    let yd = f.var(y).ty.as_tensor()?.dims.as_deref()?;
    if w.dtype != dtype || !dtype.is_float() {
        return None;
    }
    let ranks = if xi == 0 {
        [xd.len(), w.shape.len()]
    } else {
        [w.shape.len(), xd.len()]
    };
    let spec = EinsumSpec::parse(subscripts, &ranks).ok()?;
    let (lx, lw) = (spec.inputs.get(xi)?, spec.inputs.get(1 - xi)?);
    let out = &spec.output;
    if yd.len() != out.len() {
        return None;
    }
    let distinct = |ls: &[usize]| ls.iter().enumerate().all(|(i, l)| !ls[..i].contains(l));
    if !distinct(lx) || !distinct(lw) {
        return None;
    }
    // Every label is a row, a column or contracted: exactly one of "the other operand has it"
    // and "the output has it".
    let fits =
        |ls: &[usize], other: &[usize]| ls.iter().all(|l| other.contains(l) != out.contains(l));
    if !fits(lx, lw) || !fits(lw, lx) {
        return None;
    }
    let rows: Vec<usize> = (0..lx.len()).filter(|&i| !lw.contains(&lx[i])).collect();
    let kx: Vec<usize> = (0..lx.len()).filter(|&i| lw.contains(&lx[i])).collect();
    let cols: Vec<usize> = (0..lw.len()).filter(|&i| !lx.contains(&lw[i])).collect();
    if rows.is_empty() || kx.is_empty() || cols.is_empty() {
        return None;
    }
    // The contracted labels, in x's order, as positions in w; their extents must agree.
    let kw: Vec<usize> = kx
        .iter()
        .map(|&i| lw.iter().position(|&l| l == lx[i]))
        .collect::<Option<_>>()?;
    let mut k = 1i64;
    for (&i, &j) in kx.iter().zip(&kw) {
        let e = *w.shape.get(j)?;
        if xd.get(i)?.as_static() != Some(e) {
            return None;
        }
        k = k.checked_mul(e)?;
    }
    let col_ext: Vec<i64> = cols.iter().map(|&j| w.shape[j]).collect();
    let n = col_ext
        .iter()
        .try_fold(1i64, |acc, &e| acc.checked_mul(e))?;
    let wperm: Vec<usize> = kw.iter().chain(&cols).copied().collect();
    let permuted = match non_identity(wperm) {
        Some(p) => permute_constant(w, &p)?,
        None => w.clone(),
    };
    let w2 = Constant {
        shape: vec![k, n],
        ..permuted
    };
    // Rows then columns, as labels, against the output's order.
    let order: Vec<usize> = rows
        .iter()
        .map(|&i| lx[i])
        .chain(cols.iter().map(|&j| lw[j]))
        .collect();
    let out_perm: Vec<usize> = out
        .iter()
        .map(|l| order.iter().position(|o| o == l))
        .collect::<Option<_>>()?;
    Some(Site {
        y,
        x,
        x_perm: non_identity(rows.iter().chain(&kx).copied().collect()),
        rows: rows.iter().map(|&i| xd[i].clone()).collect(),
        contracted: (kx.len(), k),
        w2,
        cols: col_ext,
        out_perm: non_identity(out_perm),
        dtype,
    })
}

/// Rewrites every site of `f`; says whether anything changed.
fn rewrite_in(f: &mut Function) -> bool {
    let sites: Vec<Site> = {
        let view = FunctionView::new(f);
        f.bindings()
            .filter_map(|b| site(&view, f, b.var, b.value))
            .collect()
    };
    let changed = !sites.is_empty();
    for s in sites {
        let (nk, k) = s.contracted;
        let n: i64 = s.cols.iter().product();
        let rows_and = |last: &[i64]| -> Vec<Dim> {
            let mut d = s.rows.clone();
            d.extend(last.iter().map(|&e| Dim::Static(e)));
            d
        };
        let mut calls: Vec<ChainCall> = Vec::new();
        if let Some(p) = &s.x_perm {
            let xd = f.expr(s.x).ty.as_tensor().and_then(|t| t.dims.clone());
            let Some(xd) = xd else { continue };
            let dims = p.iter().map(|&i| xd[i].clone()).collect();
            let axes = Some(p.iter().map(|&i| i as i64).collect());
            calls.push((Op::PermuteDims { axes }, vec![], dims, "x"));
        }
        if nk != 1 {
            let d = rows_and(&[k]);
            calls.push((Op::Reshape, vec![shape_arg(f, &d)], d, "flat"));
        }
        let w_ty = Type::tensor_dims(vec![Dim::Static(k), Dim::Static(n)], s.dtype);
        let w2 = f.add_expr(ExprKind::Const(s.w2), w_ty);
        let mm = Op::Matmul { out_dtype: None };
        calls.push((mm, vec![w2], rows_and(&[n]), "mm"));
        if s.cols.len() != 1 {
            let d = rows_and(&s.cols);
            calls.push((Op::Reshape, vec![shape_arg(f, &d)], d, "cols"));
        }
        if let Some(p) = &s.out_perm {
            let ordered = rows_and(&s.cols);
            let dims = p.iter().map(|&i| ordered[i].clone()).collect();
            let axes = Some(p.iter().map(|&i| i as i64).collect());
            calls.push((Op::PermuteDims { axes }, vec![], dims, "out"));
        }
        bind_chain(f, s.y, s.x, calls, s.dtype);
    }
    changed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::{ConstTable, parse_module, print_module};

    /// `src` parsed with `consts` as `metadata["relax.expr.Constant"][i]`, rewritten, verified
    /// and printed; and the constants of the result, in the printed order.
    fn run(src: &str, consts: &[Constant]) -> (String, Vec<Constant>) {
        let mut table = ConstTable::new();
        for (i, c) in consts.iter().enumerate() {
            table.insert("relax.expr.Constant", i, c.clone());
        }
        let m = parse_module(src, "test.relax", &table).unwrap_or_else(|e| panic!("{e}"));
        let out = einsum_to_matmul(&m).unwrap_or_else(|e| panic!("{e}"));
        crate::ir::verify::verify(&out).unwrap_or_else(|e| panic!("{e:?}"));
        let printed = print_module(&out);
        let consts = printed.constants.clone();
        (printed.text, consts)
    }

    /// An `f32` constant holding 0, 1, 2, … in row-major order.
    fn iota(shape: &[i64]) -> Constant {
        let n: i64 = shape.iter().product();
        let bytes = (0..n).flat_map(|v| (v as f32).to_le_bytes()).collect();
        Constant::from_bytes(DType::F32, shape.to_vec(), bytes).unwrap()
    }

    fn values(c: &Constant) -> Vec<f32> {
        c.data
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    }

    fn module(x: &str, y: &str, eq: &str) -> String {
        format!(
            r#"@I.ir_module
class Module:
    @R.function
    def main(x: R.Tensor({x}, dtype="float32")) -> R.Tensor({y}, dtype="float32"):
        with R.dataflow():
            q: R.Tensor({y}, dtype="float32") = R.einsum((x, metadata["relax.expr.Constant"][0]), subscripts="{eq}")
            gv: R.Tensor({y}, dtype="float32") = R.nn.relu(q)
            R.output(gv)
        return gv
"#
        )
    }

    #[test]
    fn a_projection_to_heads_is_a_matmul_and_a_reshape_of_its_columns() {
        let src = module("(s, b, 4)", "(s, b, 2, 3)", "ibh,hnd->ibnd");
        let (out, consts) = run(&src, &[iota(&[4, 2, 3])]);
        assert!(
            out.contains("q_mm: R.Tensor((s, b, 6), dtype=\"float32\") = R.matmul(x, metadata[\"relax.expr.Constant\"][0]"),
            "{out}"
        );
        assert!(out.contains("q: R.Tensor((s, b, 2, 3), dtype=\"float32\") = R.reshape(q_mm, R.shape([s, b, 2, 3]))"), "{out}");
        assert!(!out.contains("einsum"), "{out}");
        // W as [h, n·d]: the same bytes (h is already first).
        assert_eq!(consts[0].shape, vec![4, 6]);
        assert_eq!(
            values(&consts[0]),
            (0..24).map(|v| v as f32).collect::<Vec<_>>()
        );
    }

    #[test]
    fn a_projection_from_heads_flattens_them_and_transposes_the_weight_once() {
        let src = module("(s, b, 2, 3)", "(s, b, 4)", "ibnd,hnd->ibh");
        let (out, consts) = run(&src, &[iota(&[4, 2, 3])]);
        assert!(
            out.contains(
                "q_flat: R.Tensor((s, b, 6), dtype=\"float32\") = R.reshape(x, R.shape([s, b, 6]))"
            ),
            "{out}"
        );
        assert!(out.contains("q: R.Tensor((s, b, 4), dtype=\"float32\") = R.matmul(q_flat, metadata[\"relax.expr.Constant\"][0]"), "{out}");
        // W2[(n, d), h] = O[h, n, d], written independently of the pass's odometer.
        assert_eq!(consts[0].shape, vec![6, 4]);
        let want: Vec<f32> = (0..6)
            .flat_map(|nd| (0..4).map(move |h| (h * 6 + nd) as f32))
            .collect();
        assert_eq!(values(&consts[0]), want);
    }

    #[test]
    fn rows_and_columns_in_another_order_are_transposed_around_the_product() {
        // y[n, i] = Σ_h x[h, i] · w[n, h]: x transposed to rows first, the result to n first.
        let src = module("(4, s)", "(3, s)", "hi,nh->ni");
        let (out, consts) = run(&src, &[iota(&[3, 4])]);
        assert!(
            out.contains(
                "q_x: R.Tensor((s, 4), dtype=\"float32\") = R.permute_dims(x, axes=[1, 0])"
            ),
            "{out}"
        );
        assert!(out.contains("q_mm: R.Tensor((s, 3), dtype=\"float32\") = R.matmul(q_x, metadata[\"relax.expr.Constant\"][0]"), "{out}");
        assert!(
            out.contains(
                "q: R.Tensor((3, s), dtype=\"float32\") = R.permute_dims(q_mm, axes=[1, 0])"
            ),
            "{out}"
        );
        let want: Vec<f32> = (0..4)
            .flat_map(|h| (0..3).map(move |n| (n * 4 + h) as f32))
            .collect();
        assert_eq!(values(&consts[0]), want);
    }

    #[test]
    fn einsums_that_are_not_dense_layers_stay() {
        // A batch label (b in x, w and the output), a label summed in x alone, a repeated
        // label, and (below) two activations.
        for (x, w, y, eq) in [
            ("(2, 5, 4)", vec![2, 4, 3], "(2, 5, 3)", "bik,bkj->bij"),
            ("(5, 4, 7)", vec![4, 3], "(5, 3)", "ikz,kj->ij"),
            ("(4, 4)", vec![4, 3], "(3,)", "kk,kj->j"),
        ] {
            let src = module(x, y, eq);
            let (out, _) = run(&src, &[iota(&w)]);
            assert!(out.contains("R.einsum"), "{eq}: {out}");
        }
        let two = r#"@I.ir_module
class Module:
    @R.function
    def main(q: R.Tensor((4, 1, 2, 3), dtype="float32"), k: R.Tensor((4, 1, 2, 3), dtype="float32")) -> R.Tensor((1, 2, 4, 4), dtype="float32"):
        with R.dataflow():
            s: R.Tensor((1, 2, 4, 4), dtype="float32") = R.einsum((q, k), subscripts="ibnd,jbnd->bnij")
            R.output(s)
        return s
"#;
        let (out, _) = run(two, &[]);
        assert!(out.contains("R.einsum"), "{out}");
    }
}
