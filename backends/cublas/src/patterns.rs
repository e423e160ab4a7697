//! The cuBLAS pattern table and its check: TVM's `relax/backend/cuda/cublas.py` in TVM's order,
//! with `_check_matmul`'s rules and a reason for every rejection.
//!
//! Contract:
//!
//! - [`table`] returns, most specific first (priorities 90 down to 10, so the pipeline's stable
//!   sort keeps TVM's order): `cublas.matmul_transposed_multiply`,
//!   `cublas.matmul_transposed_bias_gelu`, `cublas.matmul_transposed_bias_relu`,
//!   `cublas.matmul_transposed_bias`, `cublas.matmul_transposed`, `cublas.matmul_bias_gelu`,
//!   `cublas.matmul_bias_relu`, `cublas.matmul_bias`, `cublas.matmul`. TVM's second entry,
//!   `cublas.matmul_transposed_dequantize`, is left out: fusebox's op set has no
//!   `relax.dequantize` and no float8 dtypes, so no module can contain what it matches.
//! - Every entry carries [`MatmulCheck`] (`cublas_matmul`), which applies TVM's rules in TVM's
//!   order and rejects with the first one that fails:
//!   1. no intermediate of the match is used outside it (the stock leak check);
//!   2. the (lhs, rhs) dtypes are float16/float16, float32/float32, int8/int8 or
//!      bfloat16/bfloat16 (TVM's float8 pair cannot occur here);
//!   3. the reduction dim `lhs.shape[-1]` is a static integer;
//!   4. int8: `K % 4 == 0`, and `rhs.shape[-1]` is static and a multiple of 4 (`rhs` is the
//!      captured operand, i.e. the weight *before* `permute_dims` in the transposed entries, as
//!      in TVM);
//!   5. a bias: not with int8, and `prod(bias.shape[:-1])` is static and at most 1 (a vector);
//!   6. batches: with `lb = prod(lhs.shape[:-2])` and `rb = prod(rhs.shape[:-2])`, accepted when
//!      either is a bare symbolic dim, `lb == rb` is provable, or `lb >= 1` is provable and
//!      `rb == 1`.
//! - What the partition accepts is exactly what TVM's `partition_for_cublas` accepts. Things
//!   TVM accepts at partition time but cannot run (an int8 matmul writing int8, a scalar bias,
//!   a `permute_dims` that is not a transpose of the last two axes) are declined later by the
//!   backend's claim, with the reason, so the function runs elsewhere.
//!
//! ```text
//! lv = R.permute_dims(w, axes=None)     # w: (64, 32) float16
//! lv1 = R.matmul(x, lv)                  # x: (16, 32) float16
//! lv2 = R.add(lv1, b)                    # b: (64,)
//! y = R.nn.relu(lv2)                     # -> cublas.matmul_transposed_bias_relu
//! ```

use fusebox_core::ir::{DType, Dim, TensorType, Type};
use fusebox_core::pattern::check::{Check, CheckContext, NoLeakingIntermediates, Verdict};
use fusebox_core::pattern::helpers::matmul;
use fusebox_core::pattern::{Pattern, PatternBuilder, ShapeDim};
use fusebox_core::transform::FusionPattern;
use std::sync::Arc;

/// The names of the table's entries, in application order.
pub const PATTERN_NAMES: [&str; 9] = [
    "cublas.matmul_transposed_multiply",
    "cublas.matmul_transposed_bias_gelu",
    "cublas.matmul_transposed_bias_relu",
    "cublas.matmul_transposed_bias",
    "cublas.matmul_transposed",
    "cublas.matmul_bias_gelu",
    "cublas.matmul_bias_relu",
    "cublas.matmul_bias",
    "cublas.matmul",
];

/// The cuBLAS pattern table (see the module doc).
pub fn table() -> Vec<FusionPattern> {
    let check: Arc<dyn Check> = Arc::new(MatmulCheck);
    let mut pats: Vec<(&str, Pattern)> = vec![(PATTERN_NAMES[0], matmul_multiply(true))];
    let mut i = 1;
    for transposed in [true, false] {
        for (bias, act) in [
            (true, Some("relax.nn.gelu")),
            (true, Some("relax.nn.relu")),
            (true, None),
            (false, None),
        ] {
            pats.push((PATTERN_NAMES[i], matmul(bias, act, transposed)));
            i += 1;
        }
    }
    let n = pats.len() as i32;
    pats.into_iter()
        .enumerate()
        .map(|(i, (name, p))| {
            FusionPattern::new(name, p)
                .with_priority((n - i as i32) * 10)
                .with_check(check.clone())
        })
        .collect()
}

/// `make_matmul_multiply_pattern`: `astype(multiply(matmul(lhs, rhs'), multiply(scaleA : [1],
/// scaleB : [1])))`, with `rhs' = permute_dims(rhs)` when transposed.
pub fn matmul_multiply(transposed_rhs: bool) -> Pattern {
    let mut b = PatternBuilder::new();
    let lw = b.wildcard();
    let lhs = b.capture("lhs", lw);
    let rw = b.wildcard();
    let mut rhs = b.capture("rhs", rw);
    if transposed_rhs {
        rhs = b.call("relax.permute_dims", vec![rhs]);
    }
    let mm = b.call("relax.matmul", vec![lhs, rhs]);
    let root = b.capture("root", mm);
    let one = vec![ShapeDim::Dim(Dim::Static(1))];
    let sa = b.wildcard();
    let sa = b.shape(sa, one.clone());
    let sa = b.capture("scaleA", sa);
    let sb = b.wildcard();
    let sb = b.shape(sb, one);
    let sb = b.capture("scaleB", sb);
    let scale = b.call("relax.multiply", vec![sa, sb]);
    let out = b.call("relax.multiply", vec![root, scale]);
    let out = b.call("relax.astype", vec![out]);
    b.finish(out)
}

/// TVM's `_check_matmul` (see the module doc for the rules and their order).
#[derive(Clone, Copy, Debug, Default)]
pub struct MatmulCheck;

impl Check for MatmulCheck {
    fn name(&self) -> &str {
        "cublas_matmul"
    }

    fn check(&self, cx: &CheckContext<'_, '_>) -> Verdict {
        if let Verdict::Reject { reason } = NoLeakingIntermediates.check(cx) {
            return Verdict::Reject { reason };
        }
        let ty = |name: &str| cx.capture(name).and_then(|e| cx.ty(e));
        let operands = MatmulOperands {
            lhs: ty("lhs"),
            rhs: ty("rhs"),
            bias: cx.capture("bias").map(|e| cx.ty(e)),
        };
        match check_operands(&operands) {
            Ok(()) => Verdict::Accept,
            Err(reason) => Verdict::Reject { reason },
        }
    }
}

/// The types [`check_operands`] looks at: the captured `lhs`, `rhs` (pre-transpose) and, when
/// the pattern has one, `bias` (`Some(None)`: captured but untyped).
#[derive(Clone, Copy, Debug)]
pub struct MatmulOperands<'a> {
    /// The `lhs` capture's type.
    pub lhs: Option<&'a Type>,
    /// The `rhs` capture's type.
    pub rhs: Option<&'a Type>,
    /// The `bias` capture's type, when the pattern has a bias.
    pub bias: Option<Option<&'a Type>>,
}

/// TVM's rules 2 to 6 on the operand types; `Err` holds the reason of the first that fails.
pub fn check_operands(ops: &MatmulOperands<'_>) -> Result<(), String> {
    fn tensor<'t>(t: Option<&'t Type>, what: &str) -> Result<&'t TensorType, String> {
        t.and_then(Type::as_tensor)
            .ok_or_else(|| format!("{what} is not a tensor"))
    }
    let lhs = tensor(ops.lhs, "lhs")?;
    let rhs = tensor(ops.rhs, "rhs")?;
    let (Some(ld), Some(rd)) = (lhs.dtype, rhs.dtype) else {
        return Err("an operand's dtype is unknown".into());
    };
    let supported = matches!(
        (ld, rd),
        (DType::F16, DType::F16)
            | (DType::F32, DType::F32)
            | (DType::I8, DType::I8)
            | (DType::BF16, DType::BF16)
    );
    if !supported {
        return Err(format!(
            "unsupported dtypes (lhs {ld}, rhs {rd}): cuBLAS takes float16, bfloat16, float32 \
             or int8 on both sides"
        ));
    }
    let ls = lhs.dims.as_deref().ok_or("lhs has an unknown shape")?;
    let rs = rhs.dims.as_deref().ok_or("rhs has an unknown shape")?;
    let (Some(k), Some(r_last)) = (ls.last(), rs.last()) else {
        return Err("an operand has rank 0".into());
    };
    let Some(kv) = k.as_static() else {
        return Err(format!(
            "the reduction dim (lhs.shape[-1] = {k}) is not a static integer"
        ));
    };
    let int8 = ld == DType::I8;
    if int8 {
        if kv % 4 != 0 {
            return Err(format!(
                "int8 GEMM needs the reduction dim to be a multiple of 4 (K = {kv})"
            ));
        }
        match r_last.as_static() {
            Some(v) if v % 4 == 0 => {}
            _ => {
                return Err(format!(
                    "int8 GEMM needs rhs.shape[-1] to be a static multiple of 4 (found {r_last})"
                ));
            }
        }
    }
    if let Some(bias) = ops.bias {
        if int8 {
            return Err("int8 GEMM takes no bias epilogue".into());
        }
        let b = tensor(bias, "bias")?;
        let bs = b.dims.as_deref().ok_or("bias has an unknown shape")?;
        let lead = bs.split_last().map_or(&[][..], |(_, l)| l);
        match product(lead).as_static() {
            Some(v) if v <= 1 => {}
            _ => {
                return Err(format!(
                    "the bias must be a vector (one row broadcast over the output): bias shape \
                     {} has {} rows",
                    shape_str(bs),
                    product(lead)
                ));
            }
        }
    }
    let (lb, rb) = (batch_product(ls), batch_product(rs));
    if lb.is_bare_sym() || rb.is_bare_sym() || lb == rb || (lb.provably_ge_one() && rb.is_one()) {
        Ok(())
    } else {
        Err(format!(
            "batch counts differ: lhs {} has {lb}, rhs {} has {rb}; cuBLASLt needs equal batch \
             counts, or a non-batched rhs (the lhs batch is then flattened into M)",
            shape_str(ls),
            shape_str(rs)
        ))
    }
}

fn batch_product(shape: &[Dim]) -> Product {
    product(shape.get(..shape.len().saturating_sub(2)).unwrap_or(&[]))
}

/// `(a, b, c)` as TVM prints a shape.
pub fn shape_str(dims: &[Dim]) -> String {
    let parts: Vec<String> = dims.iter().map(ToString::to_string).collect();
    if parts.len() == 1 {
        format!("({},)", parts[0])
    } else {
        format!("({})", parts.join(", "))
    }
}

/// A product of dims in canonical form: a static coefficient times sorted symbolic factors, so
/// `b * c` and `c * b` compare equal (what TVM's analyzer proves for these products).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Product {
    /// The product of the static dims (`None` on overflow).
    pub coef: Option<i64>,
    /// The non-static dims, sorted.
    pub factors: Vec<Dim>,
}

/// The product of `dims` (1 for none), folding `1 * x` to `x` and `0 * x` to `0` as TVM does.
pub fn product(dims: &[Dim]) -> Product {
    let mut coef = Some(1i64);
    let mut factors = Vec::new();
    for d in dims {
        match d.as_static() {
            Some(v) => coef = coef.and_then(|c| c.checked_mul(v)),
            None => factors.push(d.clone()),
        }
    }
    if coef == Some(0) {
        factors.clear();
    }
    factors.sort();
    Product { coef, factors }
}

impl Product {
    /// The value when every factor is static.
    pub fn as_static(&self) -> Option<i64> {
        if self.factors.is_empty() {
            self.coef
        } else {
            None
        }
    }

    /// A single symbolic variable (TVM: `isinstance(prod, tir.Var)`).
    pub fn is_bare_sym(&self) -> bool {
        self.coef == Some(1) && matches!(self.factors.as_slice(), [Dim::Sym(_)])
    }

    fn is_one(&self) -> bool {
        self.as_static() == Some(1)
    }

    /// Provably `>= 1`: only static products (TVM's analyzer knows no bounds of shape vars).
    fn provably_ge_one(&self) -> bool {
        self.as_static().is_some_and(|v| v >= 1)
    }
}

impl std::fmt::Display for Product {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut parts: Vec<String> = Vec::new();
        match self.coef {
            Some(1) if !self.factors.is_empty() => {}
            Some(c) => parts.push(c.to_string()),
            None => parts.push("(overflow)".into()),
        }
        for d in &self.factors {
            match d {
                Dim::Expr(_) => parts.push(format!("({d})")),
                _ => parts.push(d.to_string()),
            }
        }
        f.write_str(&parts.join(" * "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(dims: &[Dim], d: DType) -> Type {
        Type::tensor_dims(dims.to_vec(), d)
    }
    fn s(v: &[i64]) -> Vec<Dim> {
        v.iter().map(|&x| Dim::Static(x)).collect()
    }
    fn check(lhs: &Type, rhs: &Type, bias: Option<&Type>) -> Result<(), String> {
        check_operands(&MatmulOperands {
            lhs: Some(lhs),
            rhs: Some(rhs),
            bias: bias.map(Some),
        })
    }

    #[test]
    fn table_is_tvms_order_with_decreasing_priorities() {
        let t = table();
        let names: Vec<&str> = t.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, PATTERN_NAMES);
        assert!(t.windows(2).all(|w| w[0].priority > w[1].priority));
        assert!(
            t.iter()
                .all(|p| p.check.as_ref().map(|c| c.name()) == Some("cublas_matmul"))
        );
        assert_eq!(
            t[0].pattern.to_string(),
            "relax.astype(relax.multiply(root @ relax.matmul(lhs @ _, relax.permute_dims(rhs @ _)), \
             relax.multiply(scaleA @ _ : [1], scaleB @ _ : [1])))"
        );
        assert_eq!(
            t[1].pattern.to_string(),
            "relax.nn.gelu(relax.add(root @ relax.matmul(lhs @ _, relax.permute_dims(rhs @ _)), \
             bias @ _))"
        );
        assert_eq!(
            t[8].pattern.to_string(),
            "root @ relax.matmul(lhs @ _, rhs @ _)"
        );
        // The table lints clean: nothing shadows anything (checks make entries non-general).
        assert!(fusebox_core::pattern_table::lint(&t).is_empty());
    }

    #[test]
    fn dtype_rule() {
        for d in [DType::F16, DType::F32, DType::BF16] {
            assert_eq!(check(&t(&s(&[4, 8]), d), &t(&s(&[8, 4]), d), None), Ok(()));
        }
        let e = check(
            &t(&s(&[4, 8]), DType::F64),
            &t(&s(&[8, 4]), DType::F64),
            None,
        );
        assert_eq!(
            e,
            Err(
                "unsupported dtypes (lhs float64, rhs float64): cuBLAS takes float16, bfloat16, \
                 float32 or int8 on both sides"
                    .into()
            )
        );
        let e = check(
            &t(&s(&[4, 8]), DType::F16),
            &t(&s(&[8, 4]), DType::F32),
            None,
        );
        assert!(e.is_err_and(|e| e.contains("lhs float16, rhs float32")));
        let untyped = Type::Tensor(fusebox_core::ir::TensorType {
            dims: Some(s(&[8, 4]).into()),
            ndim: Some(2),
            dtype: None,
        });
        assert_eq!(
            check(&t(&s(&[4, 8]), DType::F16), &untyped, None),
            Err("an operand's dtype is unknown".into())
        );
    }

    #[test]
    fn reduction_dim_must_be_static() {
        let k = Dim::sym("k");
        let e = check(
            &t(&[Dim::Static(4), k.clone()], DType::F16),
            &t(&[k, Dim::Static(4)], DType::F16),
            None,
        );
        assert_eq!(
            e,
            Err("the reduction dim (lhs.shape[-1] = k) is not a static integer".into())
        );
        let m = Dim::sym("m");
        assert_eq!(
            check(
                &t(&[m, Dim::Static(8)], DType::F16),
                &t(&s(&[8, 4]), DType::F16),
                None
            ),
            Ok(())
        );
    }

    #[test]
    fn int8_rules() {
        let i8t = |v: &[i64]| t(&s(v), DType::I8);
        assert_eq!(check(&i8t(&[4, 8]), &i8t(&[8, 4]), None), Ok(()));
        assert_eq!(
            check(&i8t(&[4, 6]), &i8t(&[6, 4]), None),
            Err("int8 GEMM needs the reduction dim to be a multiple of 4 (K = 6)".into())
        );
        assert_eq!(
            check(&i8t(&[4, 8]), &i8t(&[8, 6]), None),
            Err("int8 GEMM needs rhs.shape[-1] to be a static multiple of 4 (found 6)".into())
        );
        let sym = t(&[Dim::Static(8), Dim::sym("n")], DType::I8);
        assert!(
            check(&i8t(&[4, 8]), &sym, None)
                .is_err_and(|e| e.contains("static multiple of 4 (found n)"))
        );
        assert_eq!(
            check(&i8t(&[4, 8]), &i8t(&[8, 4]), Some(&i8t(&[4]))),
            Err("int8 GEMM takes no bias epilogue".into())
        );
    }

    #[test]
    fn bias_must_be_a_vector() {
        let f = |v: &[i64]| t(&s(v), DType::F16);
        assert_eq!(check(&f(&[4, 8]), &f(&[8, 16]), Some(&f(&[16]))), Ok(()));
        assert_eq!(check(&f(&[4, 8]), &f(&[8, 16]), Some(&f(&[1, 16]))), Ok(()));
        assert_eq!(check(&f(&[4, 8]), &f(&[8, 16]), Some(&f(&[1]))), Ok(()));
        assert_eq!(
            check(&f(&[4, 8]), &f(&[8, 16]), Some(&f(&[4, 16]))),
            Err(
                "the bias must be a vector (one row broadcast over the output): bias shape \
                 (4, 16) has 4 rows"
                    .into()
            )
        );
        let batched = f(&[2, 1, 16]);
        assert!(
            check(&f(&[2, 4, 8]), &f(&[2, 8, 16]), Some(&batched))
                .is_err_and(|e| e.contains("(2, 1, 16) has 2 rows"))
        );
        let sym = t(&[Dim::sym("b"), Dim::Static(16)], DType::F16);
        assert!(
            check(&f(&[4, 8]), &f(&[8, 16]), Some(&sym)).is_err_and(|e| e.contains("has b rows"))
        );
    }

    #[test]
    fn batch_rule_as_tvm() {
        let f = |v: &[Dim]| t(v, DType::F16);
        let st = |v: &[i64]| f(&s(v));
        // Equal batch counts, and a batched lhs with a 2-D rhs.
        assert_eq!(check(&st(&[4, 16, 8]), &st(&[4, 8, 16]), None), Ok(()));
        assert_eq!(check(&st(&[2, 3, 16, 8]), &st(&[8, 16]), None), Ok(()));
        assert_eq!(check(&st(&[2, 3, 16, 8]), &st(&[6, 8, 16]), None), Ok(()));
        // 2-D x 3-D and (2,3) x (1,3) are rejected.
        let e = check(&st(&[16, 8]), &st(&[4, 8, 16]), None);
        assert_eq!(
            e,
            Err(
                "batch counts differ: lhs (16, 8) has 1, rhs (4, 8, 16) has 4; cuBLASLt needs \
                 equal batch counts, or a non-batched rhs (the lhs batch is then flattened into M)"
                    .into()
            )
        );
        assert!(check(&st(&[2, 3, 16, 8]), &st(&[1, 3, 8, 16]), None).is_err());
        // Symbolic: a bare var on either side is accepted, products compare canonically.
        let (b, c) = (Dim::sym("b"), Dim::sym("c"));
        let e8 = Dim::Static(8);
        let e16 = Dim::Static(16);
        assert_eq!(
            check(
                &f(&[e16.clone(), e8.clone()]),
                &f(&[b.clone(), e8.clone(), e16.clone()]),
                None
            ),
            Ok(())
        );
        assert_eq!(
            check(
                &f(&[Dim::Static(1), b.clone(), e16.clone(), e8.clone()]),
                &f(&[e8.clone(), e16.clone()]),
                None
            ),
            Ok(())
        );
        assert_eq!(
            check(
                &f(&[b.clone(), c.clone(), e16.clone(), e8.clone()]),
                &f(&[c.clone(), b.clone(), e8.clone(), e16.clone()]),
                None
            ),
            Ok(())
        );
        // b * c against a 2-D rhs: b * c >= 1 is not provable.
        assert!(
            check(
                &f(&[b.clone(), c.clone(), e16.clone(), e8.clone()]),
                &f(&[e8.clone(), e16.clone()]),
                None
            )
            .is_err_and(|e| e.contains("has b * c, rhs (8, 16) has 1"))
        );
        // 2 * b against b: not equal.
        assert!(
            check(
                &f(&[Dim::Static(2), b.clone(), e16.clone(), e8.clone()]),
                &f(&[b.clone(), e8.clone(), e16.clone()]),
                None
            )
            .is_ok(),
            "rhs batch b is a bare var: accepted"
        );
        assert!(
            check(
                &f(&[
                    Dim::Static(2),
                    b.clone(),
                    c.clone(),
                    e16.clone(),
                    e8.clone()
                ]),
                &f(&[b.clone(), c.clone(), e8.clone(), e16]),
                None
            )
            .is_err_and(|e| e.contains("has 2 * b * c, rhs (b, c, 8, 16) has b * c"))
        );
    }

    #[test]
    fn products_fold_like_tvm() {
        assert_eq!(product(&[]).as_static(), Some(1));
        assert!(product(&[Dim::Static(1), Dim::sym("n")]).is_bare_sym());
        assert!(!product(&[Dim::Static(2), Dim::sym("n")]).is_bare_sym());
        assert_eq!(
            product(&[Dim::Static(0), Dim::sym("n")]).as_static(),
            Some(0)
        );
        let e = Dim::sym("n").add(&Dim::Static(1));
        assert!(!product(std::slice::from_ref(&e)).is_bare_sym());
        assert_eq!(product(&[Dim::Static(3), e]).to_string(), "3 * (n + 1)");
    }
}
