//! What a claimed function computes, read off its IR: the GEMM or conv2d at its root, which
//! parameters feed A, B and the epilogue, and the epilogue's ops in order.
//!
//! Contract: [`analyse`] accepts a `Codegen = "cutlass"` wrapper around one `cutlass.*`
//! composite, or a bare `cutlass.*` composite, whose body is
//!
//! ```text
//! root = matmul(lhs, rhs') | conv2d(data, weight)   rhs' = rhs | permute_dims(rhs) (last two axes)
//! then any chain of: add / multiply with a parameter (bias-like vector or the output's shape),
//!                    relu, gelu, gelu_tanh, sigmoid, silu, clip(lo, hi)
//! ```
//!
//! with one element type on every tensor (float16, bfloat16 or float32; matmul/conv2d
//! `out_dtype` unset or equal), conv2d in NHWC/OHWI with an NHWC output and `groups = 1`.
//! Anything else is [`crate::Error::Unsupported`] with the reason (the claim's decline).
//!
//! A `cutlass.attention` / `cutlass.attention_bias` composite is read by
//! [`analyse_attention`] instead, into an [`AttentionSpec`]:
//!
//! ```text
//! y = R.nn.attention_bias(q, k, v, b, scale=None, causal_mask="BottomRight", window_size=None)
//!     # q: (2, 37, 8, 64) f16, k, v: (2, 53, 2, 64) f16, b: (1, 8, 37, 53) f16
//! # -> AttentionSpec { qkv: [0, 1, 2], bias: Some(3), elem: F16, head_dim: 64,
//! #                    options: causal BottomRight, BSNH }  kernel fusebox_attn_f16_d64_causal_bias
//! ```

use crate::attention::{AttentionOptions, AttnElem, AttnKernel, Layout};
use crate::error::{Error, Result};
use crate::generator::{Act, Bcast, BinOp, Elem, EpOp};
use fusebox_core::ir::{Callee, DType, Dim, ExprId, ExprKind, Function, PrimValue, Type, VarId};
use fusebox_core::op::{CausalMask, Conv2dAttrs, Op};
use std::collections::HashMap;

/// The main computation.
#[derive(Clone, Debug, PartialEq)]
pub enum Problem {
    /// `matmul(lhs, rhs)` or `matmul(lhs, permute_dims(rhs))`.
    Gemm {
        /// Argument index of lhs.
        lhs: usize,
        /// Argument index of rhs (as stored).
        rhs: usize,
        /// Whether the matmul reads `rhs` transposed (B stored N×K).
        rhs_transposed: bool,
    },
    /// `conv2d(data, weight)`, NHWC / OHWI.
    Conv2d {
        /// Argument index of the data.
        data: usize,
        /// Argument index of the weight.
        weight: usize,
        /// The conv's attributes.
        attrs: Box<Conv2dAttrs>,
    },
}

/// A claimed function, analysed.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelSpec {
    /// The composite's name.
    pub composite: String,
    /// How many arguments the function takes.
    pub num_params: usize,
    /// GEMM or conv2d.
    pub problem: Problem,
    /// The epilogue ops, in order.
    pub epilogue: Vec<EpOp>,
    /// The argument index of each extra operand of the epilogue, in order.
    pub extras: Vec<usize>,
    /// The element type.
    pub elem: Elem,
}

impl std::fmt::Display for KernelSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.problem {
            Problem::Gemm {
                rhs_transposed: true,
                ..
            } => "gemm (B transposed)",
            Problem::Gemm { .. } => "gemm",
            Problem::Conv2d { .. } => "conv2d fprop (implicit GEMM)",
        };
        write!(f, "{} ({kind}, {}", self.composite, self.elem.tag())?;
        if !self.epilogue.is_empty() {
            let ops: Vec<String> = self.epilogue.iter().map(EpOp::tag).collect();
            write!(f, ", epilogue {}", ops.join(" -> "))?;
        }
        f.write_str(")")
    }
}

fn unsupported(name: &str, reason: impl Into<String>) -> Error {
    Error::Unsupported {
        function: name.to_string(),
        reason: reason.into(),
    }
}

/// The composite inside `func` and the argument index feeding each of its parameters.
fn composite_of<'f>(name: &str, func: &'f Function) -> Result<(&'f Function, Vec<usize>)> {
    if let Some(c) = &func.attrs.composite {
        if !c.starts_with("cutlass.") {
            return Err(unsupported(
                name,
                format!("composite `{c}` is not a cutlass pattern"),
            ));
        }
        return Ok((func, (0..func.params.len()).collect()));
    }
    match func.attrs.codegen.as_deref() {
        Some("cutlass") => {}
        Some(other) => {
            return Err(unsupported(
                name,
                format!("its Codegen is `{other}`, not `cutlass`"),
            ));
        }
        None => {
            return Err(unsupported(
                name,
                "it is neither a `cutlass.*` composite nor a `Codegen = \"cutlass\"` function",
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
            } if call.is_none() => call = Some((*v, args)),
            _ => {
                return Err(unsupported(
                    name,
                    "a merged region (cutlass runs one composite per function)",
                ));
            }
        }
    }
    let (Some((callee, args)), [(fv, g)]) = (call, inner.as_slice()) else {
        return Err(unsupported(
            name,
            "expected one composite and one call of it",
        ));
    };
    if *fv != callee || args.len() != g.params.len() {
        return Err(unsupported(name, "the call does not match the composite"));
    }
    match &g.attrs.composite {
        Some(c) if c.starts_with("cutlass.") => {}
        _ => {
            return Err(unsupported(
                name,
                "the local function is not a cutlass composite",
            ));
        }
    }
    let map = args
        .iter()
        .map(|&a| {
            func.as_var(a)
                .and_then(|v| func.params.iter().position(|p| *p == v))
                .ok_or_else(|| {
                    unsupported(
                        name,
                        "the wrapper passes something other than its parameters",
                    )
                })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok((g, map))
}

#[derive(Clone, Debug)]
enum Val {
    Param(usize),
    Transposed(usize),
    Chain,
    Scalar(f64),
}

/// The generator element type of a dtype, if it has one.
pub fn elem_of(d: DType) -> Option<Elem> {
    match d {
        DType::F16 => Some(Elem::F16),
        DType::BF16 => Some(Elem::Bf16),
        DType::F32 => Some(Elem::F32),
        _ => None,
    }
}

fn dims_of(ty: &Type) -> Option<&[Dim]> {
    ty.as_tensor().and_then(|t| t.dims.as_deref())
}

/// Whether `shape` is bias-like for `n` output channels: `shape[-1] == n == prod(shape)`.
pub fn bias_like(shape: &[Dim], n: &Dim) -> bool {
    let Some(last) = shape.last() else {
        return false;
    };
    last == n
        && shape[..shape.len() - 1]
            .iter()
            .all(|d| d.as_static() == Some(1))
}

/// Analyses `func` (named `name`) into a [`KernelSpec`] (see the module doc).
pub fn analyse(name: &str, func: &Function) -> Result<KernelSpec> {
    let (g, map) = composite_of(name, func)?;
    let composite = g.attrs.composite.clone().unwrap_or_default();
    let mut vals: HashMap<VarId, Val> = HashMap::new();
    for (i, &p) in g.params.iter().enumerate() {
        vals.insert(p, Val::Param(map.get(i).copied().unwrap_or(i)));
    }
    let arg = |vals: &HashMap<VarId, Val>, e: ExprId| -> Result<Val> {
        match &g.expr(e).kind {
            ExprKind::Var(v) => vals
                .get(v)
                .cloned()
                .ok_or_else(|| unsupported(name, format!("`{}` is not defined", g.var(*v).name))),
            ExprKind::Prim(PrimValue::Int(i)) => Ok(Val::Scalar(*i as f64)),
            ExprKind::Prim(PrimValue::Float(x, _)) => Ok(Val::Scalar(*x)),
            ExprKind::Const(_) => Err(unsupported(
                name,
                "a constant operand (cutlass takes its operands as arguments)",
            )),
            _ => Err(unsupported(name, "an argument that is not a var")),
        }
    };
    let mut problem = None;
    let mut elem = None;
    let mut epilogue = Vec::new();
    let mut extras = Vec::new();
    // The output shape of the chain (the root's), and its channel dim.
    let mut out_dims: Option<Vec<Dim>> = None;
    for b in g.bindings() {
        let data = g.expr(b.value);
        let ExprKind::Call {
            callee: Callee::Op(op),
            args,
        } = &data.kind
        else {
            return Err(unsupported(name, "a binding that is not an op call"));
        };
        let a: Vec<Val> = args.iter().map(|&e| arg(&vals, e)).collect::<Result<_>>()?;
        let ty_of = |i: usize| args.get(i).map(|&e| &g.expr(e).ty);
        let val = match (op, a.as_slice()) {
            (Op::PermuteDims { axes }, [Val::Param(p)]) => {
                let rank = ty_of(0)
                    .and_then(Type::as_tensor)
                    .and_then(|t| t.rank())
                    .ok_or_else(|| unsupported(name, "permute_dims of unknown rank"))?;
                let swap = rank >= 2
                    && match axes {
                        None => rank == 2,
                        Some(ax) => {
                            let r = rank as i64;
                            let norm: Vec<i64> =
                                ax.iter().map(|&x| if x < 0 { x + r } else { x }).collect();
                            let mut want: Vec<i64> = (0..r).collect();
                            want.swap(rank - 2, rank - 1);
                            norm == want
                        }
                    };
                if !swap {
                    return Err(unsupported(
                        name,
                        "a permute_dims that is not a transpose of the last two axes",
                    ));
                }
                Val::Transposed(*p)
            }
            (Op::Matmul { out_dtype }, [Val::Param(l), r]) if problem.is_none() => {
                let (rhs, rhs_transposed) = match r {
                    Val::Param(r) => (*r, false),
                    Val::Transposed(r) => (*r, true),
                    _ => return Err(unsupported(name, "the matmul's rhs is computed")),
                };
                let (lt, rt) = (ty_of(0), ty_of(1));
                let ld = lt.and_then(Type::as_tensor).and_then(|t| t.dtype);
                let rd = rt.and_then(Type::as_tensor).and_then(|t| t.dtype);
                let e = match (ld, rd) {
                    (Some(x), Some(y)) if x == y => elem_of(x),
                    _ => None,
                }
                .ok_or_else(|| {
                    unsupported(
                        name,
                        format!(
                            "matmul operands of dtypes {ld:?} and {rd:?}: the generator emits \
                             float16, bfloat16 and float32 kernels"
                        ),
                    )
                })?;
                if out_dtype.is_some_and(|d| elem_of(d) != Some(e)) {
                    return Err(unsupported(
                        name,
                        "a matmul out_dtype other than its inputs'",
                    ));
                }
                let (lr, rr) = (
                    lt.and_then(Type::as_tensor).and_then(|t| t.rank()),
                    rt.and_then(Type::as_tensor).and_then(|t| t.rank()),
                );
                if lr.is_some_and(|r| r < 2) || rr.is_some_and(|r| r < 2) {
                    return Err(unsupported(name, "a matmul of a vector (rank 1)"));
                }
                elem = Some(e);
                problem = Some(Problem::Gemm {
                    lhs: *l,
                    rhs,
                    rhs_transposed,
                });
                out_dims = dims_of(&data.ty).map(<[Dim]>::to_vec);
                Val::Chain
            }
            (Op::Conv2d(attrs), [Val::Param(x), Val::Param(w)]) if problem.is_none() => {
                if attrs.data_layout != "NHWC"
                    || attrs.kernel_layout != "OHWI"
                    || attrs.out_layout != "NHWC"
                {
                    return Err(unsupported(
                        name,
                        format!(
                            "conv2d layouts {}/{}/{}: the kernels take NHWC/OHWI/NHWC",
                            attrs.data_layout, attrs.kernel_layout, attrs.out_layout
                        ),
                    ));
                }
                if attrs.groups != 1 {
                    return Err(unsupported(
                        name,
                        format!("grouped conv2d (groups = {})", attrs.groups),
                    ));
                }
                let xd = ty_of(0).and_then(Type::as_tensor).and_then(|t| t.dtype);
                let wd = ty_of(1).and_then(Type::as_tensor).and_then(|t| t.dtype);
                let e = match (xd, wd) {
                    (Some(a), Some(b)) if a == b => elem_of(a),
                    _ => None,
                }
                .ok_or_else(|| {
                    unsupported(
                        name,
                        format!(
                            "conv2d operands of dtypes {xd:?} and {wd:?}: the generator emits \
                             float16, bfloat16 and float32 kernels"
                        ),
                    )
                })?;
                if attrs.out_dtype.is_some_and(|d| elem_of(d) != Some(e)) {
                    return Err(unsupported(
                        name,
                        "a conv2d out_dtype other than its inputs'",
                    ));
                }
                elem = Some(e);
                problem = Some(Problem::Conv2d {
                    data: *x,
                    weight: *w,
                    attrs: attrs.clone(),
                });
                out_dims = dims_of(&data.ty).map(<[Dim]>::to_vec);
                Val::Chain
            }
            (Op::Add | Op::Multiply, [x, y]) => {
                let (p, pi) = match (x, y) {
                    (Val::Chain, Val::Param(p)) => (*p, 1),
                    (Val::Param(p), Val::Chain) => (*p, 0),
                    _ => {
                        return Err(unsupported(
                            name,
                            format!("`{}` that is not the chain and one argument", op.name()),
                        ));
                    }
                };
                let od = out_dims
                    .as_deref()
                    .ok_or_else(|| unsupported(name, "the output shape is unknown"))?;
                let pt = ty_of(pi).ok_or_else(|| unsupported(name, "untyped operand"))?;
                if pt.as_tensor().and_then(|t| t.dtype).and_then(elem_of) != elem {
                    return Err(unsupported(
                        name,
                        "an epilogue operand of another dtype than the output",
                    ));
                }
                let pd =
                    dims_of(pt).ok_or_else(|| unsupported(name, "an operand of unknown shape"))?;
                let n = od
                    .last()
                    .ok_or_else(|| unsupported(name, "a rank-0 output"))?;
                let bcast = if pd == od {
                    Bcast::Full
                } else if bias_like(pd, n) {
                    Bcast::Vector
                } else {
                    return Err(unsupported(
                        name,
                        format!(
                            "an epilogue operand of shape {} is neither the output's shape {} \
                             nor a vector over its last dim",
                            crate::patterns::shape_str(pd),
                            crate::patterns::shape_str(od)
                        ),
                    ));
                };
                let bop = if matches!(op, Op::Add) {
                    BinOp::Add
                } else {
                    BinOp::Mul
                };
                epilogue.push(EpOp::Binary(bop, bcast));
                extras.push(p);
                Val::Chain
            }
            (Op::Relu | Op::Gelu | Op::GeluTanh | Op::Sigmoid | Op::Silu, [Val::Chain]) => {
                epilogue.push(EpOp::Act(match op {
                    Op::Relu => Act::Relu,
                    Op::Gelu => Act::Gelu,
                    Op::GeluTanh => Act::GeluTanh,
                    Op::Sigmoid => Act::Sigmoid,
                    _ => Act::Silu,
                }));
                Val::Chain
            }
            (Op::Clip, [Val::Chain, Val::Scalar(lo), Val::Scalar(hi)]) => {
                epilogue.push(EpOp::Clip(*lo, *hi));
                Val::Chain
            }
            (op, _) => {
                return Err(unsupported(
                    name,
                    format!("`{}` here is not part of a GEMM/conv2d epilogue", op.name()),
                ));
            }
        };
        vals.insert(b.var, val);
    }
    // The composite must return the end of the chain.
    let ret = g
        .ret
        .and_then(|e| g.as_var(e))
        .and_then(|v| vals.get(&v))
        .ok_or_else(|| unsupported(name, "the composite returns nothing it computed"))?;
    if !matches!(ret, Val::Chain) {
        return Err(unsupported(
            name,
            "the composite does not return the GEMM/conv2d result",
        ));
    }
    let (Some(problem), Some(elem)) = (problem, elem) else {
        return Err(unsupported(name, "no matmul or conv2d"));
    };
    Ok(KernelSpec {
        composite,
        num_params: func.params.len(),
        problem,
        epilogue,
        extras,
        elem,
    })
}

/// A claimed `cutlass.attention` / `cutlass.attention_bias` function, analysed: which
/// arguments are Q, K, V and the bias, and the options the fused kernel runs with.
#[derive(Clone, Debug, PartialEq)]
pub struct AttentionSpec {
    /// The composite's name.
    pub composite: String,
    /// How many arguments the function takes.
    pub num_params: usize,
    /// Argument indices of query, key and value.
    pub qkv: [usize; 3],
    /// Argument index of the bias, for `attention_bias`.
    pub bias: Option<usize>,
    /// The element type (float16 or bfloat16).
    pub elem: AttnElem,
    /// The head dim (a static multiple of 16 from 32 to 128).
    pub head_dim: usize,
    /// Scale and causal mask (layout BSNH, TVM's).
    pub options: AttentionOptions,
}

impl AttentionSpec {
    /// The compiled kernel this spec runs.
    pub fn kernel(&self) -> AttnKernel {
        AttnKernel {
            elem: self.elem,
            head_dim: self.head_dim,
            causal: self.options.causal.is_some(),
            bias: self.bias.is_some(),
        }
    }
}

impl std::fmt::Display for AttentionSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} (fused attention, {:?}, head_dim {}",
            self.composite, self.elem, self.head_dim
        )?;
        if let Some(c) = self.options.causal {
            write!(f, ", causal {c:?}")?;
        }
        if self.bias.is_some() {
            f.write_str(", bias")?;
        }
        if let Some(s) = self.options.scale {
            write!(f, ", scale {s}")?;
        }
        f.write_str(")")
    }
}

/// Whether `func` (a `Codegen = "cutlass"` wrapper or a bare composite) holds a
/// `cutlass.attention*` composite.
pub fn is_attention(name: &str, func: &Function) -> bool {
    composite_of(name, func).is_ok_and(|(g, _)| {
        g.attrs
            .composite
            .as_deref()
            .is_some_and(|c| c.starts_with("cutlass.attention"))
    })
}

/// Analyses a `cutlass.attention` / `cutlass.attention_bias` function into an
/// [`AttentionSpec`]. Its composite holds one call of `relax.nn.attention(q, k, v)` or
/// `relax.nn.attention_bias(q, k, v, bias)` on its parameters, returned. The fused kernel runs
/// (else [`Error::Unsupported`] with the reason, so the claim declines and the function goes to
/// the next backend): float16 or bfloat16 operands of one dtype (the bias too); a static head
/// dim, a multiple of 16 from 32 to 128, equal for query, key and value; key and value of one
/// shape (the same heads); no `window_size`. With static shapes the launch is planned here as
/// well ([`crate::attention::plan`]), so what is claimed runs.
pub fn analyse_attention(name: &str, func: &Function) -> Result<AttentionSpec> {
    let (g, map) = composite_of(name, func)?;
    let composite = g.attrs.composite.clone().unwrap_or_default();
    let bindings: Vec<_> = g.bindings().collect();
    let [b] = bindings.as_slice() else {
        return Err(unsupported(
            name,
            format!(
                "the attention composite has {} bindings; the fused kernel runs one attention call",
                bindings.len()
            ),
        ));
    };
    if g.ret.and_then(|e| g.as_var(e)) != Some(b.var) {
        return Err(unsupported(
            name,
            "the composite does not return the attention's result",
        ));
    }
    let ExprKind::Call {
        callee: Callee::Op(op),
        args,
    } = &g.expr(b.value).kind
    else {
        return Err(unsupported(
            name,
            "the composite's binding is not an op call",
        ));
    };
    let (attrs, with_bias) = match op {
        Op::Attention(a) => (a, false),
        Op::AttentionBias(a) => (a, true),
        other => {
            return Err(unsupported(
                name,
                format!("`{}` is not relax.nn.attention", other.name()),
            ));
        }
    };
    if let Some(w) = attrs.window_size {
        return Err(unsupported(
            name,
            format!("sliding-window attention (window_size={w}) is not generated"),
        ));
    }
    if args.len() != 3 + usize::from(with_bias) {
        return Err(unsupported(
            name,
            "attention with a wrong number of operands",
        ));
    }
    let mut idx = Vec::with_capacity(args.len());
    let mut tys = Vec::with_capacity(args.len());
    for (&a, what) in args.iter().zip(["query", "key", "value", "bias"]) {
        let p = g
            .as_var(a)
            .and_then(|v| g.params.iter().position(|p| *p == v))
            .ok_or_else(|| {
                unsupported(
                    name,
                    format!(
                        "the {what} is not a parameter (cutlass takes its operands as arguments)"
                    ),
                )
            })?;
        idx.push(map.get(p).copied().unwrap_or(p));
        let t = g
            .expr(a)
            .ty
            .as_tensor()
            .ok_or_else(|| unsupported(name, format!("the {what} is not a tensor")))?;
        tys.push((t, what));
    }
    let dtype = tys[0].0.dtype;
    let elem = dtype.and_then(AttnElem::of).ok_or_else(|| {
        unsupported(
            name,
            format!(
                "a {} query: the fused attention kernel takes float16 or bfloat16",
                dtype.map_or("void", DType::name)
            ),
        )
    })?;
    for (t, what) in &tys[1..] {
        if t.dtype != dtype {
            return Err(unsupported(
                name,
                format!(
                    "the {what} is {}, the query {}: the kernel takes one dtype",
                    t.dtype.map_or("void", DType::name),
                    elem.dtype()
                ),
            ));
        }
    }
    let dims = |i: usize| -> Result<&[Dim]> {
        let (t, what) = &tys[i];
        t.dims
            .as_deref()
            .filter(|d| d.len() == 4)
            .ok_or_else(|| unsupported(name, format!("the {what} has no known rank-4 shape")))
    };
    let (qd, kd, vd) = (dims(0)?, dims(1)?, dims(2)?);
    let head_dim = qd[3]
        .as_static()
        .and_then(|h| usize::try_from(h).ok())
        .ok_or_else(|| unsupported(name, format!("the head dim {} is not static", qd[3])))?;
    let kernel = AttnKernel {
        elem,
        head_dim,
        causal: attrs.causal_mask.is_some(),
        bias: with_bias,
    };
    kernel
        .check()
        .map_err(|e| unsupported(name, e.to_string()))?;
    if kd[2] != vd[2] || kd[3] != vd[3] || vd[3] != qd[3] {
        return Err(unsupported(
            name,
            format!(
                "value {} and key {}: the kernel needs the key's heads and head dim for the value",
                crate::patterns::shape_str(vd),
                crate::patterns::shape_str(kd)
            ),
        ));
    }
    let options = AttentionOptions {
        scale: attrs.scale.map(|s| s.0),
        causal: attrs.causal_mask.map(|c| match c {
            CausalMask::TopLeft => crate::attention::CausalMask::TopLeft,
            CausalMask::BottomRight => crate::attention::CausalMask::BottomRight,
        }),
        layout: Layout::Bsnh,
    };
    let statics: Option<Vec<Vec<usize>>> = tys
        .iter()
        .map(|(t, _)| {
            t.static_shape()?
                .into_iter()
                .map(|d| usize::try_from(d).ok())
                .collect()
        })
        .collect();
    if let Some(s) = statics {
        let dt = elem.dtype();
        crate::attention::plan(
            (&s[0], dt),
            (&s[1], dt),
            (&s[2], dt),
            s.get(3).map(|b| (b.as_slice(), dt)),
            &options,
        )
        .map_err(|e| unsupported(name, e.to_string()))?;
    }
    Ok(AttentionSpec {
        composite,
        num_params: func.params.len(),
        qkv: [idx[0], idx[1], idx[2]],
        bias: idx.get(3).copied(),
        elem,
        head_dim,
        options,
    })
}
