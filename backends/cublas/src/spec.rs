//! What a claimed function computes, read off its IR: which parameter (or constant) is the lhs,
//! the rhs (and whether it is used through a `permute_dims` of its last two axes), the bias,
//! the activation, the scales, and the dtypes. Shapes stay symbolic here; [`crate::plan`] turns
//! a spec and the concrete shapes of one call into a cuBLASLt plan.
//!
//! Contract: [`analyse`] accepts a `Codegen = "cublas"` wrapper around one `cublas.*` composite,
//! or a bare `cublas.*` composite (`annotate_codegen = false`), whose body is one of
//!
//! ```text
//! matmul(lhs, rhs')                         rhs' = rhs | permute_dims(rhs)  (last two axes)
//! act(add(matmul(lhs, rhs'), bias))         act  = none | relu | gelu | gelu_tanh; add either way round
//! act(matmul(lhs, rhs'))
//! astype(multiply(matmul(lhs, rhs'), multiply(sa, sb)))     sa, sb of shape (1,)
//! ```
//!
//! with dtypes cuBLASLt runs: (float16 | bfloat16) -> itself or float32, float32 -> float32,
//! int8 -> int32 (no epilogue). Anything else is an [`crate::Error::Unsupported`] whose reason
//! says what (the claim's decline reason). `relax.nn.gelu` (erf) is run with cuBLASLt's GELU
//! epilogue, which is the tanh approximation (at most 4.8e-4 apart, at x = ±2.70), as TVM does.

use crate::error::{Error, Result};
use fusebox_core::ir::{Callee, DType, Dim, ExprId, ExprKind, Function, Type, VarId};
use fusebox_core::op::Op;
use fusebox_core::runtime::Tensor;
use std::collections::HashMap;
use std::fmt;

/// Where an operand comes from at run time.
#[derive(Clone, Debug, PartialEq)]
pub enum Operand {
    /// The artifact's argument of this index.
    Param(usize),
    /// A constant bound inside the composite (`bind_constants = true`).
    Const(Tensor),
}

/// The activation of the epilogue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Activation {
    /// `relax.nn.relu`.
    Relu,
    /// `relax.nn.gelu` or `relax.nn.gelu_tanh`: cuBLASLt computes the tanh approximation.
    Gelu,
}

/// A claimed function, analysed.
#[derive(Clone, Debug, PartialEq)]
pub struct MatmulSpec {
    /// The composite's name (`cublas.matmul_bias_relu`).
    pub composite: String,
    /// How many arguments the function takes.
    pub num_params: usize,
    /// The lhs (`x` of `x @ w`).
    pub lhs: Operand,
    /// The rhs as stored: `w`, or the `w` of `permute_dims(w)` when `rhs_transposed`.
    pub rhs: Operand,
    /// Whether the matmul reads `permute_dims(rhs)` (a swap of the last two axes).
    pub rhs_transposed: bool,
    /// The bias vector, when there is an `add`.
    pub bias: Option<Operand>,
    /// The activation after the bias (or after the matmul).
    pub activation: Option<Activation>,
    /// The two scales multiplied into the result (the `multiply` variant): `alpha = sa * sb`.
    pub scale: Option<(Operand, Operand)>,
    /// The dtype of lhs and rhs.
    pub in_dtype: DType,
    /// The dtype of the result (cuBLASLt's D).
    pub out_dtype: DType,
    /// The rank of the declared lhs and rhs (when known), for messages.
    pub ranks: (Option<usize>, Option<usize>),
    /// The declared static N (output columns), when known: checked against the bias.
    pub static_n: Option<i64>,
}

impl fmt::Display for MatmulSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} ({} -> {}",
            self.composite, self.in_dtype, self.out_dtype
        )?;
        if self.rhs_transposed {
            f.write_str(", transposed rhs")?;
        }
        if self.bias.is_some() {
            f.write_str(", bias")?;
        }
        match self.activation {
            Some(Activation::Relu) => f.write_str(", relu")?,
            Some(Activation::Gelu) => f.write_str(", gelu (tanh)")?,
            None => {}
        }
        if self.scale.is_some() {
            f.write_str(", scaled")?;
        }
        f.write_str(")")
    }
}

/// The composite inside `func` and, for each of its parameters, the index of the argument of
/// `func` that feeds it.
fn composite_of<'f>(name: &str, func: &'f Function) -> Result<(&'f Function, Vec<usize>)> {
    let unsupported = |reason: String| Error::Unsupported {
        function: name.to_string(),
        reason,
    };
    if let Some(c) = &func.attrs.composite {
        if !c.starts_with("cublas.") {
            return Err(unsupported(format!(
                "composite `{c}` is not a cublas pattern"
            )));
        }
        return Ok((func, (0..func.params.len()).collect()));
    }
    match func.attrs.codegen.as_deref() {
        Some("cublas") => {}
        Some(other) => {
            return Err(unsupported(format!(
                "its Codegen is `{other}`, not `cublas`"
            )));
        }
        None => {
            return Err(unsupported(
                "it is neither a `cublas.*` composite nor a `Codegen = \"cublas\"` function".into(),
            ));
        }
    }
    let mut inner: Vec<(VarId, &Function)> = Vec::new();
    let mut call: Option<(VarId, &[ExprId])> = None;
    for b in func.bindings() {
        match &func.expr(b.value).kind {
            ExprKind::Function(g) => inner.push((b.var, g)),
            ExprKind::Call {
                callee: Callee::Local(v),
                args,
            } => {
                if call.is_some() {
                    return Err(unsupported(
                        "a merged region with several composites (cublas runs one matmul per \
                         function)"
                            .into(),
                    ));
                }
                call = Some((*v, args));
            }
            _ => {
                return Err(unsupported(
                    "the Codegen function has a binding that is neither its composite nor the \
                     call of it"
                        .into(),
                ));
            }
        }
    }
    let (Some((callee, args)), [(fv, g)]) = (call, inner.as_slice()) else {
        return Err(unsupported(format!(
            "expected one composite and one call of it, found {} composite(s)",
            inner.len()
        )));
    };
    if *fv != callee {
        return Err(unsupported("the call is not of the composite".into()));
    }
    let Some(c) = &g.attrs.composite else {
        return Err(unsupported("the local function has no Composite".into()));
    };
    if !c.starts_with("cublas.") {
        return Err(unsupported(format!(
            "composite `{c}` is not a cublas pattern"
        )));
    }
    if args.len() != g.params.len() {
        return Err(unsupported("the composite call's arity is wrong".into()));
    }
    let map = args
        .iter()
        .map(|&a| {
            func.as_var(a)
                .and_then(|v| func.params.iter().position(|p| *p == v))
                .ok_or_else(|| {
                    unsupported("the wrapper passes something other than its parameters".into())
                })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok((g, map))
}

/// What a var of the composite holds, during the walk.
#[derive(Clone, Debug)]
enum Val {
    Operand(Operand),
    Transposed(Operand),
    Scale(Operand, Operand),
    Chain(Stage),
}

/// How far along `matmul → bias → act` / `matmul → multiply → astype` a value is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    Matmul,
    Bias,
    Act,
    Scaled,
    Cast,
}

fn dtype_of(ty: &Type) -> Option<DType> {
    ty.as_tensor().and_then(|t| t.dtype)
}

/// Whether `axes` (for a tensor of rank `rank`) swaps exactly the last two axes: `Some(true)`;
/// the identity: `Some(false)`; anything else: `None`.
pub fn transpose_kind(axes: Option<&[i64]>, rank: usize) -> Option<bool> {
    let perm: Vec<usize> = match axes {
        None => (0..rank).rev().collect(),
        Some(a) => {
            let mut v = Vec::with_capacity(a.len());
            for &x in a {
                let r = i64::try_from(rank).ok()?;
                let x = if x < 0 { x + r } else { x };
                v.push(usize::try_from(x).ok().filter(|&x| x < rank)?);
            }
            v
        }
    };
    if perm.len() != rank {
        return None;
    }
    if perm.iter().enumerate().all(|(i, &p)| i == p) {
        return Some(false);
    }
    let swapped = rank >= 2
        && perm[..rank - 2].iter().enumerate().all(|(i, &p)| i == p)
        && perm[rank - 2] == rank - 1
        && perm[rank - 1] == rank - 2;
    swapped.then_some(true)
}

/// Analyses `func` (named `name`) into a [`MatmulSpec`] (see the module doc).
pub fn analyse(name: &str, func: &Function) -> Result<MatmulSpec> {
    let unsupported = |reason: String| Error::Unsupported {
        function: name.to_string(),
        reason,
    };
    let (g, map) = composite_of(name, func)?;
    let composite = g.attrs.composite.clone().unwrap_or_default();
    let mut vals: HashMap<VarId, Val> = HashMap::new();
    for (i, &p) in g.params.iter().enumerate() {
        let idx = map.get(i).copied().unwrap_or(i);
        vals.insert(p, Val::Operand(Operand::Param(idx)));
    }
    let arg = |vals: &HashMap<VarId, Val>, e: ExprId| -> Result<Val> {
        match &g.expr(e).kind {
            ExprKind::Var(v) => vals
                .get(v)
                .cloned()
                .ok_or_else(|| unsupported(format!("`{}` is not defined", g.var(*v).name))),
            ExprKind::Const(c) => Ok(Val::Operand(Operand::Const(
                Tensor::from_constant(c).map_err(|e| unsupported(e.to_string()))?,
            ))),
            _ => Err(unsupported(
                "an argument is neither a var nor a constant".into(),
            )),
        }
    };
    let mut lhs = None;
    let mut rhs = None;
    let mut rhs_transposed = false;
    let mut bias = None;
    let mut activation = None;
    let mut scale = None;
    let mut matmul_out = None;
    let mut cast_to = None;
    let mut in_dtype = None;
    let mut ranks = (None, None);
    let mut static_n = None;
    let mut last: Option<VarId> = None;
    for b in g.bindings() {
        let data = g.expr(b.value);
        let val = match &data.kind {
            ExprKind::Var(_) | ExprKind::Const(_) => arg(&vals, b.value)?,
            ExprKind::Call {
                callee: Callee::Op(op),
                args,
            } => {
                let a: Vec<Val> = args.iter().map(|&e| arg(&vals, e)).collect::<Result<_>>()?;
                let chain = |v: &Val| match v {
                    Val::Chain(s) => Some(*s),
                    _ => None,
                };
                match (op, a.as_slice()) {
                    (Op::PermuteDims { axes }, [Val::Operand(x)]) => {
                        let rank = args
                            .first()
                            .and_then(|&e| g.expr(e).ty.as_tensor())
                            .and_then(|t| t.rank())
                            .ok_or_else(|| {
                                unsupported("permute_dims of a tensor of unknown rank".into())
                            })?;
                        match transpose_kind(axes.as_deref(), rank) {
                            Some(true) => Val::Transposed(x.clone()),
                            Some(false) => Val::Operand(x.clone()),
                            None => {
                                return Err(unsupported(format!(
                                    "permute_dims(axes={}) of a rank-{rank} tensor is not a \
                                     transpose of the last two axes",
                                    axes.as_ref()
                                        .map_or("None".to_string(), |a| format!("{a:?}"))
                                )));
                            }
                        }
                    }
                    (Op::Matmul { out_dtype }, [Val::Operand(l), r]) if matmul_out.is_none() => {
                        match r {
                            Val::Operand(r) => rhs = Some(r.clone()),
                            Val::Transposed(r) => {
                                rhs = Some(r.clone());
                                rhs_transposed = true;
                            }
                            _ => {
                                return Err(unsupported(
                                    "the matmul's rhs is computed inside the function".into(),
                                ));
                            }
                        }
                        lhs = Some(l.clone());
                        let (lt, rt) = (
                            args.first().map(|&e| &g.expr(e).ty),
                            args.get(1).map(|&e| &g.expr(e).ty),
                        );
                        let (ld, rd) = (lt.and_then(dtype_of), rt.and_then(dtype_of));
                        match (ld, rd) {
                            (Some(x), Some(y)) if x == y => in_dtype = Some(x),
                            _ => {
                                return Err(unsupported(format!(
                                    "matmul operands of dtypes {} and {}",
                                    ld.map_or("unknown".into(), |d| d.to_string()),
                                    rd.map_or("unknown".into(), |d| d.to_string())
                                )));
                            }
                        }
                        ranks = (
                            lt.and_then(Type::as_tensor).and_then(|t| t.rank()),
                            rt.and_then(Type::as_tensor).and_then(|t| t.rank()),
                        );
                        static_n = rt
                            .and_then(Type::as_tensor)
                            .and_then(|t| t.dims.as_ref())
                            .filter(|d| d.len() >= 2)
                            .and_then(|d| d.last())
                            .and_then(Dim::as_static);
                        matmul_out = Some(out_dtype.or(in_dtype));
                        Val::Chain(Stage::Matmul)
                    }
                    (Op::Matmul { .. }, _) => {
                        return Err(unsupported(
                            "more than one matmul, or a matmul of computed values".into(),
                        ));
                    }
                    (Op::Add, [x, y]) => {
                        let b = match (chain(x), chain(y), x, y) {
                            (Some(Stage::Matmul), None, _, Val::Operand(o))
                            | (None, Some(Stage::Matmul), Val::Operand(o), _) => o.clone(),
                            _ => {
                                return Err(unsupported(
                                    "an add that is not the matmul plus a bias operand".into(),
                                ));
                            }
                        };
                        bias = Some(b);
                        Val::Chain(Stage::Bias)
                    }
                    (Op::Relu | Op::Gelu | Op::GeluTanh, [x])
                        if matches!(chain(x), Some(Stage::Matmul | Stage::Bias)) =>
                    {
                        activation = Some(if matches!(op, Op::Relu) {
                            Activation::Relu
                        } else {
                            Activation::Gelu
                        });
                        Val::Chain(Stage::Act)
                    }
                    (Op::Multiply, [Val::Operand(x), Val::Operand(y)]) => {
                        Val::Scale(x.clone(), y.clone())
                    }
                    (Op::Multiply, [x, y]) => {
                        let s = match (chain(x), chain(y), x, y) {
                            (Some(Stage::Matmul), None, _, Val::Scale(p, q))
                            | (None, Some(Stage::Matmul), Val::Scale(p, q), _) => {
                                (p.clone(), q.clone())
                            }
                            _ => {
                                return Err(unsupported(
                                    "a multiply that is not the matmul times a product of two \
                                     scales"
                                        .into(),
                                ));
                            }
                        };
                        scale = Some(s);
                        Val::Chain(Stage::Scaled)
                    }
                    (Op::Astype { dtype }, [x]) if chain(x) == Some(Stage::Scaled) => {
                        cast_to = Some(*dtype);
                        Val::Chain(Stage::Cast)
                    }
                    (op, _) => {
                        return Err(unsupported(format!(
                            "`{}` here is not part of a cuBLASLt matmul epilogue",
                            op.name()
                        )));
                    }
                }
            }
            _ => {
                return Err(unsupported(
                    "the composite has a binding that is not an op call".into(),
                ));
            }
        };
        vals.insert(b.var, val);
        last = Some(b.var);
    }
    let (Some(lhs), Some(rhs), Some(in_dtype), Some(matmul_out)) = (lhs, rhs, in_dtype, matmul_out)
    else {
        return Err(unsupported("the composite has no matmul".into()));
    };
    // The composite returns the end of the chain, and nothing else.
    let ret_var = g.ret.and_then(|e| g.as_var(e));
    if ret_var.is_none()
        || ret_var != last
        || !matches!(last.and_then(|v| vals.get(&v)), Some(Val::Chain(_)))
    {
        return Err(unsupported(
            "the composite does not return the end of its matmul chain (several outputs?)".into(),
        ));
    }
    let Some(matmul_out) = matmul_out else {
        return Err(unsupported("the matmul's output dtype is unknown".into()));
    };
    let out_dtype = cast_to.unwrap_or(matmul_out);
    let dt_ok = |d: DType| match in_dtype {
        DType::F16 => matches!(d, DType::F16 | DType::F32),
        DType::BF16 => matches!(d, DType::BF16 | DType::F32),
        DType::F32 => d == DType::F32,
        DType::I8 => d == DType::I32,
        _ => false,
    };
    if in_dtype == DType::I8 {
        if matmul_out != DType::I32 {
            return Err(unsupported(format!(
                "an int8 matmul writing {matmul_out}: cuBLASLt's int8 GEMM writes int32 here \
                 (use out_dtype=\"int32\"); a narrower output would saturate where the \
                 reference wraps"
            )));
        }
        if bias.is_some() || activation.is_some() || scale.is_some() {
            return Err(unsupported(
                "an int8 GEMM with an epilogue (bias, activation or scale)".into(),
            ));
        }
    }
    if !dt_ok(matmul_out) || !dt_ok(out_dtype) {
        return Err(unsupported(format!(
            "cuBLASLt does not run {in_dtype} operands with a {out_dtype} result (it takes \
             float16/bfloat16 -> itself or float32, float32 -> float32, int8 -> int32)"
        )));
    }
    if let (Some(_), Some(n)) = (&bias, static_n) {
        // The bias must hold one value per output column; a single value would be read as N.
        let bias_ty = bias_type(g);
        if let Some(last_dim) = bias_ty.and_then(|d| d.last().cloned()) {
            match last_dim.as_static() {
                Some(v) if v == n => {}
                Some(v) => {
                    return Err(unsupported(format!(
                        "the bias has {v} value(s) in its last dim but the output has {n} \
                         columns (cuBLASLt's bias epilogue reads one value per column)"
                    )));
                }
                None => {}
            }
        } else if bias_ty.is_some() {
            return Err(unsupported(format!(
                "a scalar bias (cuBLASLt's bias epilogue reads one value per column, {n} here)"
            )));
        }
    }
    Ok(MatmulSpec {
        composite,
        num_params: func.params.len(),
        lhs,
        rhs,
        rhs_transposed,
        bias,
        activation,
        scale,
        in_dtype,
        out_dtype,
        ranks,
        static_n,
    })
}

/// The dims of the bias operand of the composite's `add`, when known.
fn bias_type(g: &Function) -> Option<&[Dim]> {
    for b in g.bindings() {
        if let ExprKind::Call {
            callee: Callee::Op(Op::Add),
            args,
        } = &g.expr(b.value).kind
        {
            // The bias is the operand that is not the matmul's result.
            for &a in args {
                let is_matmul = g.as_var(a).is_some_and(|v| {
                    g.bindings().any(|x| {
                        x.var == v
                            && matches!(
                                &g.expr(x.value).kind,
                                ExprKind::Call {
                                    callee: Callee::Op(Op::Matmul { .. }),
                                    ..
                                }
                            )
                    })
                });
                if !is_matmul {
                    return g.expr(a).ty.as_tensor().and_then(|t| t.dims.as_deref());
                }
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transpose_kinds() {
        assert_eq!(transpose_kind(None, 2), Some(true));
        assert_eq!(transpose_kind(Some(&[1, 0]), 2), Some(true));
        assert_eq!(transpose_kind(Some(&[-1, -2]), 2), Some(true));
        assert_eq!(transpose_kind(Some(&[0, 2, 1]), 3), Some(true));
        assert_eq!(transpose_kind(Some(&[0, 1]), 2), Some(false));
        assert_eq!(transpose_kind(None, 1), Some(false));
        assert_eq!(transpose_kind(None, 3), None);
        assert_eq!(transpose_kind(Some(&[1, 0, 2]), 3), None);
        assert_eq!(transpose_kind(Some(&[0, 3]), 2), None);
    }
}
