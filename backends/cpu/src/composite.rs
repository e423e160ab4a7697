//! Fused kernels for the composites of the `cpu` backend's transformer patterns
//! (`backends/cpu/patterns/transformer.toml`): the body of a `Composite` function is recognised
//! by its structure (not its name), and then run by one kernel.
//!
//! Contract:
//!
//! - [`recognise`] reads a function's body and returns a [`Plan`] only when the body is exactly
//!   one of the forms below: every binding takes part, the scalars (scales, epsilon, exponents)
//!   are scalar `float32` constants with the expected values where a value is fixed, and the
//!   result is the root (or, for the residual LayerNorm, a tuple of the add and the norm).
//!   Inputs are parameters or constants ([`Leaf`]).
//! - [`run`] runs a plan on the inputs' values: `Ok(None)` when the values do not fit the
//!   kernel (dtype other than `float32`, shapes it does not handle); the caller then interprets
//!   the body, op by op. The kernels split only independent outputs over threads, so results
//!   are bit-identical for every thread count.
//!
//! ```text
//! ; cpu.attention (TorchScript form)
//! lv:  R.Tensor((b, 2, s, 16), dtype="float32") = R.multiply(q, R.const(0.5, "float32"))
//! lv1: R.Tensor((b, 2, 16, s), dtype="float32") = R.multiply(kt, R.const(0.5, "float32"))
//! lv2: R.Tensor((b, 2, s, s), dtype="float32") = R.matmul(lv, lv1, out_dtype=None)
//! lv3: R.Tensor((b, 2, s, s), dtype="float32") = R.add(lv2, mask)
//! lv4: R.Tensor((b, 2, s, s), dtype="float32") = R.nn.softmax(lv3, axis=-1)
//! lv5: R.Tensor((b, 2, s, s), dtype="bool") = R.isnan(lv4)
//! lv6: R.Tensor((b, 2, s, s), dtype="float32") = R.where(lv5, R.const(0.0, "float32"), lv4)
//! gv:  R.Tensor((b, 2, s, 16), dtype="float32") = R.matmul(lv6, v, out_dtype=None)
//! ; → attention::attention(q, kt, v, mask, scales 0.5 / 0.5, NaN guard), no [b, 2, s, s] tensor
//! ; the scores may also be masked by a select just before the softmax (MPT's, DeBERTa's
//! ; masked_fill): R.where(cond, R.const(-3.4e38, "float32"), lv3), cond a bool input
//! ; cpu.attention_heads: q, kt and v each `R.permute_dims(x, axes=..)` of a parameter, and the
//! ; result permuted too → attention::attention_permuted, none of the four transposes copied
//! ; cpu.attention_grouped (LLaMA, Mistral, Qwen2): kᵀ and v each the exporters' `repeat_kv`,
//! ; reshape(broadcast_to(expand_dims(x, axis=[r-2]), [.., Hkv, n, S, D]), [.., Hkv·n, S, D])
//! ; (kᵀ then permuted) → attention_permuted on x itself, query head h reading x's head h / n
//! ; cpu.attention_reshaped (DeBERTa): the [b·2, s, s] scores viewed around the select
//! lv3: R.Tensor((b * 2, s, s), dtype="float32") = R.add(lv2, rel)
//! lv4: R.Tensor((b, 2, s, s), dtype="float32") = R.reshape(lv3, R.shape([-1, 2, s, s]))
//! lv5: R.Tensor((b, 2, s, s), dtype="float32") = R.where(pad, R.const(-3.4e38, "float32"), lv4)
//! lv6: R.Tensor((b, 2, s, s), dtype="float32") = R.nn.softmax(lv5, axis=-1)
//! lv7: R.Tensor((b * 2, s, s), dtype="float32") = R.reshape(lv6, R.shape([-1, s, s]))
//! gv:  R.Tensor((b * 2, s, 16), dtype="float32") = R.matmul(lv7, v, out_dtype=None)
//! ; → the same kernel, `pad` ([b, 1, s, s]) read through the view [b, 2] of the batch dim
//! ; cpu.attention_einsum (LongT5): R.einsum((q, k), subscripts="...qhd,...khd->...hqk"),
//! ; an additive bias, the softmax, R.einsum((p, v), subscripts="...hqk,...khd->...qhd")
//! ; → the same kernel with q, kᵀ, v and the result read and written through permutations
//!
//! ; cpu.dense_gelu: a dense layer and its activation (also ReLU, the tanh GELU, or the bias alone)
//! lv:  R.Tensor((1, 128, 3072), dtype="float32") = R.matmul(x, W, out_dtype="void")   ; W constant
//! lv1: R.Tensor((1, 128, 3072), dtype="float32") = R.add(lv, b)                       ; b constant
//! ; ... the five ops of GELU's erf form on lv1
//! ; → dense::dense(x, W, b, Act::Gelu): one GEMM, bias and GELU on each output tile
//!
//! ; cpu.silu_gated: LLaMA's gate and up projections
//! g:  R.Tensor((1, 128, 11008), dtype="float32") = R.matmul(x, Wg, out_dtype=None)
//! s:  R.Tensor((1, 128, 11008), dtype="float32") = R.sigmoid(g)
//! a:  R.Tensor((1, 128, 11008), dtype="float32") = R.multiply(g, s)
//! u:  R.Tensor((1, 128, 11008), dtype="float32") = R.matmul(x, Wu, out_dtype=None)
//! gv: R.Tensor((1, 128, 11008), dtype="float32") = R.multiply(a, u)
//! ; → dense::silu_gated(x, Wg, Wu): the SiLU and the product in the gate GEMM's epilogue
//!
//! ; cpu.rope: x · cos + concat(-x[..., h:], x[..., :h]) · sin → rope::rope(x, cos, sin, h)
//! ```

mod attention;

use crate::attention::AttnSpec;
pub(crate) use attention::Repeat;
use fusebox_core::ir::{Callee, DType, ExprId, ExprKind, Function, VarId};
use fusebox_core::op::Op;
use fusebox_core::runtime::{Tensor, Value};
use std::collections::HashMap;

/// An input of a fused composite: a parameter (by position) or a constant expression.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Leaf {
    /// The `i`th parameter.
    Param(usize),
    /// A constant of the body.
    Const(ExprId),
}

impl Leaf {
    /// `e` of `f` as an input: a parameter or a constant; `None` for anything else.
    pub(crate) fn of(f: &Function, e: ExprId) -> Option<Leaf> {
        match &f.exprs.get(e)?.kind {
            ExprKind::Const(_) => Some(Leaf::Const(e)),
            ExprKind::Var(v) => f.params.iter().position(|p| p == v).map(Leaf::Param),
            _ => None,
        }
    }
}

/// What a recognised composite computes.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Plan {
    /// `matmul(softmax(matmul(q·s, kᵀ·s) [+ mask [+ mask]]) [NaN → 0], v)`, each of `q`, `kᵀ`
    /// and `v` optionally a `permute_dims` of the input (`cpu.attention_heads`), and so the
    /// result.
    Attention {
        q: Leaf,
        kt: Leaf,
        v: Leaf,
        /// Additive masks, in the order the graph adds them.
        masks: Vec<Leaf>,
        /// `where(cond, fill, scores)` after the additive masks: the `bool` condition and the
        /// fill (finite or `-inf`).
        select: Option<(Leaf, f32)>,
        /// The batch dims of the view the select sees, when the body reshapes the scores
        /// around it (`None` for a dim known only at run time; see
        /// [`crate::attention::SelectMask`]).
        select_view: Option<Vec<Option<usize>>>,
        spec: AttnSpec,
        /// The `permute_dims` axes applied to `q`, `kᵀ` and `v` (in that order) in the body.
        perms: [Option<Vec<usize>>; 3],
        /// The grouped-query heads' repeat in the body before `kᵀ`'s permutation and before
        /// `v` (in that order), read in place: the kernel reads the input's fewer heads.
        /// Boxed: rare, and it would double the size of every plan.
        repeats: Box<[Option<Repeat>; 2]>,
        /// The `permute_dims` axes applied to the result.
        out_perm: Option<Vec<usize>>,
    },
    /// `layer_norm(a + b, gamma, beta)` over the last axis (`gamma` / `beta` `None` without
    /// `scale` / `center`: MPT's LayerNorm has no bias); `outputs` says what the function
    /// returns: `false` the sum, `true` the norm (one entry: not a tuple).
    ResidualLayerNorm {
        a: Leaf,
        b: Leaf,
        gamma: Option<Leaf>,
        beta: Option<Leaf>,
        eps: f64,
        outputs: Vec<bool>,
    },
    /// `w * cast(x * (1 / sqrt(mean(x², -1) + eps)))` (the weight and the cast are optional).
    RmsNorm {
        x: Leaf,
        weight: Option<Leaf>,
        eps: f32,
    },
    /// GELU, erf form (`tanh == false`) or tanh form, elementwise in one pass.
    Gelu { x: Leaf, tanh: bool },
    /// `act(x @ w [+ bias])` with a rank-2 weight: one GEMM with the bias and the activation
    /// in its epilogue ([`crate::dense`]).
    Dense {
        x: Leaf,
        w: Leaf,
        bias: Option<Leaf>,
        act: crate::dense::Act,
    },
    /// LayerNorm written out (opset < 17 exports): `(x - mean(x)) / sqrt(mean((x -
    /// mean(x)) ** exp) + eps)` over the last axis, then `· gamma` and `+ beta` when present
    /// ([`crate::norm::layer_norm_decomposed`]).
    LayerNormDecomposed {
        x: Leaf,
        exp: f32,
        eps: f32,
        gamma: Option<Leaf>,
        beta: Option<Leaf>,
    },
    /// `(g · sigmoid(g)) · (x @ wu)` with `g = x @ wg`, rank-2 constant weights: two GEMMs, the
    /// SiLU and the product in the gate's epilogue ([`crate::dense::silu_gated`]).
    SiluGated {
        x: Leaf,
        wg: Leaf,
        wu: Leaf,
        order: crate::dense::GateOrder,
    },
    /// A mixture of experts' SiLU-gated MLPs, `wd[idx] @ (silu(g) · u)` with `[g, u]` (or
    /// `[u, g]`) `= wgu[idx] @ x` per row, the weights gathered by `take` or `gather_nd`
    /// ([`crate::moe::moe_silu_gated`]: grouped by expert, nothing gathered).
    MoeSiluGated {
        x: Leaf,
        idx: Leaf,
        wgu: Leaf,
        wd: Leaf,
        spec: crate::moe::MoeSpec,
    },
    /// `x · cos + concat(-x[..., h..], x[..., ..h]) · sin` over the last axis (RoPE;
    /// [`crate::rope::rope`]); `axes` are the slices' and the concat's axes as written (the
    /// kernel checks both are the last), `end` the second slice's end (at least `2h`).
    Rope {
        x: Leaf,
        cos: Leaf,
        sin: Leaf,
        half: i64,
        end: i64,
        axes: [i64; 2],
        order: crate::rope::RopeOrder,
    },
}

impl Plan {
    /// The kernel's name in profiles.
    pub(crate) fn kernel_name(&self) -> &'static str {
        match self {
            Plan::Attention { .. } => "cpu.attention(fused)",
            Plan::ResidualLayerNorm { .. } => "cpu.residual_layer_norm(fused)",
            Plan::RmsNorm { .. } => "cpu.rms_norm(fused)",
            Plan::Gelu { .. } => "cpu.gelu(fused)",
            Plan::Dense { .. } => "cpu.dense(fused)",
            Plan::SiluGated { .. } => "cpu.silu_gated(fused)",
            Plan::LayerNormDecomposed { .. } => "cpu.layer_norm_decomposed(fused)",
            Plan::Rope { .. } => "cpu.rope(fused)",
            Plan::MoeSiluGated { .. } => "cpu.moe_silu_gated(fused)",
        }
    }
}

/// The body of a function, by var: the call each binding makes.
struct Body<'f> {
    f: &'f Function,
    calls: HashMap<VarId, (&'f Op, &'f [ExprId])>,
    /// Tuple bindings (a composite with several outputs returns one).
    tuples: HashMap<VarId, &'f [ExprId]>,
    /// Tuple-get-item bindings: the tuple and the index.
    items: HashMap<VarId, (ExprId, u32)>,
    /// How many bindings the body has (a recognised form must use them all).
    count: usize,
}

impl<'f> Body<'f> {
    fn new(f: &'f Function) -> Option<Body<'f>> {
        let mut calls = HashMap::new();
        let mut tuples = HashMap::new();
        let mut items = HashMap::new();
        let mut count = 0;
        for b in f.bindings() {
            count += 1;
            match &f.expr(b.value).kind {
                ExprKind::Call {
                    callee: Callee::Op(op),
                    args,
                } => {
                    calls.insert(b.var, (op, args.as_slice()));
                }
                ExprKind::Tuple(xs) => {
                    tuples.insert(b.var, xs.as_slice());
                }
                ExprKind::TupleGetItem(t, i) => {
                    items.insert(b.var, (*t, *i));
                }
                _ => return None,
            }
        }
        Some(Body {
            f,
            calls,
            tuples,
            items,
            count,
        })
    }

    fn var_of(&self, e: ExprId) -> Option<VarId> {
        match &self.f.exprs.get(e)?.kind {
            ExprKind::Var(v) => Some(*v),
            _ => None,
        }
    }

    /// The call bound to the var `e` names, if its op is called `name`.
    fn call(&self, e: ExprId, name: &str) -> Option<(&'f Op, &'f [ExprId])> {
        let v = self.var_of(e)?;
        let (op, args) = *self.calls.get(&v)?;
        (op.name() == name).then_some((op, args))
    }

    /// The dims of `e`'s tensor type, when its shape is known.
    fn dims(&self, e: ExprId) -> Option<std::sync::Arc<[fusebox_core::ir::Dim]>> {
        match &self.f.exprs.get(e)?.ty {
            fusebox_core::ir::Type::Tensor(t) => t.dims.clone(),
            _ => None,
        }
    }

    /// The rank of `e`'s tensor type, when its shape is known.
    fn rank(&self, e: ExprId) -> Option<usize> {
        self.dims(e).map(|d| d.len())
    }

    /// `e` as an input: a parameter or a constant.
    fn leaf(&self, e: ExprId) -> Option<Leaf> {
        Leaf::of(self.f, e)
    }

    /// The value of a scalar `float32` constant.
    fn scalar(&self, e: ExprId) -> Option<f32> {
        match &self.f.exprs.get(e)?.kind {
            ExprKind::Const(c) if c.dtype == DType::F32 && c.shape.iter().product::<i64>() == 1 => {
                let b: [u8; 4] = c.data.get(..4)?.try_into().ok()?;
                Some(f32::from_le_bytes(b))
            }
            _ => None,
        }
    }

    /// The two arguments of a commutative call, the one `first` accepts first.
    fn either<T>(
        &self,
        args: &[ExprId],
        first: impl Fn(ExprId) -> Option<T>,
    ) -> Option<(T, ExprId)> {
        let [a, b] = args else { return None };
        if let Some(t) = first(*a) {
            return Some((t, *b));
        }
        first(*b).map(|t| (t, *a))
    }
}

/// Recognises the body of `f` (see the module docs); `None` for any other body.
pub(crate) fn recognise(f: &Function) -> Option<Plan> {
    let body = Body::new(f)?;
    let ret = f.ret?;
    if let Some((plan, used)) = attention::recognise(&body, ret)
        .or_else(|| silu_gated(&body, ret))
        .or_else(|| moe_silu_gated(&body, ret))
        .or_else(|| rope(&body, ret))
        .or_else(|| dense(&body, ret))
        .or_else(|| rms_norm(&body, ret))
        .or_else(|| gelu(&body, ret))
        .or_else(|| residual_layer_norm(&body, ret))
        .or_else(|| layer_norm_decomposed(&body, ret))
    {
        return (used == body.count).then_some(plan);
    }
    None
}

fn residual_layer_norm(body: &Body<'_>, ret: ExprId) -> Option<(Plan, usize)> {
    // The result: the norm, or a tuple of the norm and the sum.
    let mut used = 2;
    let fields: Vec<ExprId> = match &body.f.exprs.get(ret)?.kind {
        ExprKind::Tuple(xs) => xs.clone(),
        ExprKind::Var(v) => match body.tuples.get(v) {
            Some(xs) => {
                used += 1;
                xs.to_vec()
            }
            None => vec![ret],
        },
        _ => return None,
    };
    let norm = fields
        .iter()
        .copied()
        .find(|&e| body.call(e, "relax.nn.layer_norm").is_some())?;
    let (Op::LayerNorm(attrs), [s, gamma, beta]) = body.call(norm, "relax.nn.layer_norm")? else {
        return None;
    };
    let (_, [a, b]) = body.call(*s, "relax.add")? else {
        return None;
    };
    let rank = body.rank(norm)?;
    let last = attrs.axes.len() == 1 && (attrs.axes[0] == -1 || attrs.axes[0] == rank as i64 - 1);
    if !last {
        return None;
    }
    let (nv, sv) = (body.var_of(norm)?, body.var_of(*s)?);
    let outputs = fields
        .iter()
        .map(|&e| match body.var_of(e)? {
            v if v == nv => Some(true),
            v if v == sv => Some(false),
            _ => None,
        })
        .collect::<Option<Vec<bool>>>()?;
    Some((
        Plan::ResidualLayerNorm {
            a: body.leaf(*a)?,
            b: body.leaf(*b)?,
            gamma: if attrs.scale {
                Some(body.leaf(*gamma)?)
            } else {
                None
            },
            beta: if attrs.center {
                Some(body.leaf(*beta)?)
            } else {
                None
            },
            eps: attrs.epsilon.0,
            outputs,
        },
        used,
    ))
}

fn rms_norm(body: &Body<'_>, ret: ExprId) -> Option<(Plan, usize)> {
    let mut used = 0;
    let mut weight = None;
    let mut core = ret;
    // w * cast(core) | w * core | core
    if let Some((_, args)) = body.call(ret, "relax.multiply")
        && let Some((inner, w)) = body.either(args, |e| {
            body.call(e, "relax.astype")
                .map(|_| e)
                .or_else(|| rms_core(body, e).map(|_| e))
        })
        && matches!(
            body.f.exprs.get(w).map(|d| &d.kind),
            Some(ExprKind::Const(_))
        )
    {
        weight = Some(body.leaf(w)?);
        used += 1;
        core = inner;
        if let Some((Op::Astype { dtype: DType::F32 }, [x])) = body.call(inner, "relax.astype") {
            used += 1;
            core = *x;
        }
    }
    let (x, eps, n) = rms_core(body, core)?;
    Some((Plan::RmsNorm { x, weight, eps }, used + n))
}

/// `x * (1 / sqrt(mean(x ** 2, axis=-1, keepdims) + eps))`: (x, eps, bindings).
fn rms_core(body: &Body<'_>, e: ExprId) -> Option<(Leaf, f32, usize)> {
    let (_, args) = body.call(e, "relax.multiply")?;
    let (inv, x) = body.either(args, |a| body.call(a, "relax.divide").map(|_| a))?;
    let (_, [one, sq]) = body.call(inv, "relax.divide")? else {
        return None;
    };
    if body.scalar(*one)? != 1.0 {
        return None;
    }
    let (_, [add]) = body.call(*sq, "relax.sqrt")? else {
        return None;
    };
    let (_, add_args) = body.call(*add, "relax.add")?;
    let (eps, mean) = body.either(add_args, |a| body.scalar(a))?;
    let (Op::Mean(attrs), [pow]) = body.call(mean, "relax.mean")? else {
        return None;
    };
    let rank = body.rank(e)?;
    let last = matches!(attrs.axis.as_deref(), Some([a]) if *a == -1 || *a == rank as i64 - 1);
    if !last || !attrs.keepdims {
        return None;
    }
    let (_, [x2, two]) = body.call(*pow, "relax.power")? else {
        return None;
    };
    if body.scalar(*two)? != 2.0 || body.leaf(*x2)? != body.leaf(x)? {
        return None;
    }
    Some((body.leaf(x)?, eps, 6))
}

fn gelu(body: &Body<'_>, ret: ExprId) -> Option<(Plan, usize)> {
    let (x, tanh, used) = gelu_of(body, ret, &|e| body.leaf(e))?;
    Some((Plan::Gelu { x, tanh }, used))
}

/// GELU of an operand `x` that `operand` recognises (and names by an `X` equal for equal
/// operands): `(x, tanh form, bindings used)`.
fn gelu_of<X: PartialEq + Copy>(
    body: &Body<'_>,
    ret: ExprId,
    operand: &dyn Fn(ExprId) -> Option<X>,
) -> Option<(X, bool, usize)> {
    // erf form: 0.5 · x · (erf(x / √2) + 1), as (x · (…)) · 0.5 or x · (0.5 · (…)).
    let erf_part = |e: ExprId| -> Option<X> {
        let (_, args) = body.call(e, "relax.add")?;
        let (one, erf) = body.either(args, |a| body.scalar(a))?;
        let (_, [d]) = body.call(erf, "relax.erf")? else {
            return None;
        };
        let (_, [x, r2]) = body.call(*d, "relax.divide")? else {
            return None;
        };
        let r2 = body.scalar(*r2)?;
        ((one == 1.0) && (r2 - std::f32::consts::SQRT_2).abs() < 1e-6).then_some(())?;
        operand(*x)
    };
    let (_, args) = body.call(ret, "relax.multiply")?;
    // (x · (erf + 1)) · 0.5
    if let Some((half, inner)) = body.either(args, |a| body.scalar(a))
        && half == 0.5
        && let Some((_, iargs)) = body.call(inner, "relax.multiply")
        && let Some((x, part)) = body.either(iargs, operand)
        && erf_part(part) == Some(x)
    {
        return Some((x, false, 5));
    }
    // x · (0.5 · (erf + 1))
    if let Some((x, inner)) = body.either(args, operand)
        && let Some((_, iargs)) = body.call(inner, "relax.multiply")
        && let Some((half, part)) = body.either(iargs, |a| body.scalar(a))
        && half == 0.5
        && erf_part(part) == Some(x)
    {
        return Some((x, false, 5));
    }
    // tanh form: (x · 0.5) · (tanh((x + x³ · 0.044715) · √(2/π)) + 1)
    let (half_x, t1) = body.either(args, |a| body.call(a, "relax.multiply").map(|_| a))?;
    let (_, hargs) = body.call(half_x, "relax.multiply")?;
    let (half, x) = body.either(hargs, |a| body.scalar(a))?;
    let x = operand(x)?;
    let (_, t1args) = body.call(t1, "relax.add")?;
    let (one, th) = body.either(t1args, |a| body.scalar(a))?;
    let (_, [m]) = body.call(th, "relax.tanh")? else {
        return None;
    };
    let (_, margs) = body.call(*m, "relax.multiply")?;
    let (c, inner) = body.either(margs, |a| body.scalar(a))?;
    let (_, aargs) = body.call(inner, "relax.add")?;
    let (cube, x2) = body.either(aargs, |a| body.call(a, "relax.multiply").map(|_| a))?;
    let (_, cargs) = body.call(cube, "relax.multiply")?;
    let (k, pw) = body.either(cargs, |a| body.scalar(a))?;
    let (_, [x3, three]) = body.call(pw, "relax.power")? else {
        return None;
    };
    let ok = half == 0.5
        && one == 1.0
        && body.scalar(*three)? == 3.0
        && (k - 0.044715).abs() < 1e-6
        && (c - (2.0 / std::f32::consts::PI).sqrt()).abs() < 1e-6
        && operand(x2)? == x
        && operand(*x3)? == x;
    ok.then_some((x, true, 8))
}

/// `x @ w [+ bias]` with `w` (and the bias) constants: `(x, w, bias, bindings used)`.
fn dense_core(body: &Body<'_>, e: ExprId) -> Option<(Leaf, Leaf, Option<Leaf>, usize)> {
    let is_const = |e: ExprId| {
        matches!(
            body.f.exprs.get(e).map(|d| &d.kind),
            Some(ExprKind::Const(_))
        )
        .then(|| body.leaf(e))
        .flatten()
    };
    let product = |e: ExprId| -> Option<(Leaf, Leaf)> {
        let (Op::Matmul { out_dtype: None }, [x, w]) = body.call(e, "relax.matmul")? else {
            return None;
        };
        Some((body.leaf(*x)?, is_const(*w)?))
    };
    if let Some((_, args)) = body.call(e, "relax.add")
        && let Some(((x, w), b)) = body.either(args, product)
    {
        return Some((x, w, Some(is_const(b)?), 2));
    }
    let (x, w) = product(e)?;
    Some((x, w, None, 1))
}

/// A dense layer: `relu(core)`, GELU of `core` (either form), or `core` with its bias.
fn dense(body: &Body<'_>, ret: ExprId) -> Option<(Plan, usize)> {
    use crate::dense::Act;
    let plan = |(x, w, bias, n): (Leaf, Leaf, Option<Leaf>, usize), act: Act, used: usize| {
        (Plan::Dense { x, w, bias, act }, n + used)
    };
    if let Some((_, [c])) = body.call(ret, "relax.nn.relu") {
        return Some(plan(dense_core(body, *c)?, Act::Relu, 1));
    }
    // The GELU's operand is the core's var (each use of it the same var).
    let core_var = |e: ExprId| dense_core(body, e).and(body.var_of(e));
    if let Some((v, tanh, used)) = gelu_of(body, ret, &core_var) {
        let core = body.f.var(v).expr;
        let act = if tanh { Act::GeluTanh } else { Act::Gelu };
        return Some(plan(dense_core(body, core)?, act, used));
    }
    let core = dense_core(body, ret)?;
    // A lone product is just the matmul kernel: only a bias makes it a dense layer.
    core.2.is_some().then(|| plan(core, Act::None, 0))
}

/// `relax.mean(x, axis=[last], keepdims=True)` of `e`'s var: its operand.
fn mean_last(body: &Body<'_>, e: ExprId) -> Option<ExprId> {
    let (Op::Mean(attrs), [x]) = body.call(e, "relax.mean")? else {
        return None;
    };
    let rank = body.rank(*x)?;
    let last = matches!(attrs.axis.as_deref(), Some([a]) if *a == -1 || *a == rank as i64 - 1);
    (last && attrs.keepdims).then_some(*x)
}

/// LayerNorm as the exporters write it before ONNX's LayerNormalization (opset < 17):
/// `[+ beta] [· gamma] ((x - mean(x)) / sqrt(mean(d ** e) + eps))`, `d` the subtraction's var,
/// means over the last axis, `gamma`, `beta`, `e`, `eps` constants.
fn layer_norm_decomposed(body: &Body<'_>, ret: ExprId) -> Option<(Plan, usize)> {
    let konst = |e: ExprId| {
        matches!(
            body.f.exprs.get(e).map(|d| &d.kind),
            Some(ExprKind::Const(_))
        )
        .then(|| body.leaf(e))
        .flatten()
    };
    let (mut e, mut used, mut gamma, mut beta) = (ret, 7, None, None);
    if let Some((_, args)) = body.call(e, "relax.add")
        && let Some((b, inner)) = body.either(args, konst)
    {
        (beta, e, used) = (Some(b), inner, used + 1);
    }
    if let Some((_, args)) = body.call(e, "relax.multiply")
        && let Some((g, inner)) = body.either(args, konst)
    {
        (gamma, e, used) = (Some(g), inner, used + 1);
    }
    let (_, [d, s]) = body.call(e, "relax.divide")? else {
        return None;
    };
    let (_, [x, m]) = body.call(*d, "relax.subtract")? else {
        return None;
    };
    let xl = body.leaf(*x)?;
    if body.leaf(mean_last(body, *m)?)? != xl {
        return None;
    }
    let (_, [a]) = body.call(*s, "relax.sqrt")? else {
        return None;
    };
    let (_, add_args) = body.call(*a, "relax.add")?;
    let (eps, var) = body.either(add_args, |a| body.scalar(a))?;
    let p = mean_last(body, var)?;
    let (_, [d2, ex]) = body.call(p, "relax.power")? else {
        return None;
    };
    if body.var_of(*d2)? != body.var_of(*d)? {
        return None;
    }
    let exp = body.scalar(*ex)?;
    Some((
        Plan::LayerNormDecomposed {
            x: xl,
            exp,
            eps,
            gamma,
            beta,
        },
        used,
    ))
}

/// A SiLU-gated MLP's gate and up projections: `multiply(multiply(g, sigmoid(g)), x @ wu)`
/// with `g = x @ wg`, either operand order in each multiply, both products of the same `x`
/// by constants and without a bias.
fn silu_gated(body: &Body<'_>, ret: ExprId) -> Option<(Plan, usize)> {
    let (_, args) = body.call(ret, "relax.multiply")?;
    // The SiLU: `g · sigmoid(g)`, `g` a product's var; (g's var, gate first, bindings used).
    let silu = |e: ExprId| -> Option<(VarId, bool, usize)> {
        let (_, [a, b]) = body.call(e, "relax.multiply")? else {
            return None;
        };
        let sig_of = |s: ExprId| -> Option<VarId> {
            let (_, [g]) = body.call(s, "relax.sigmoid")? else {
                return None;
            };
            body.var_of(*g)
        };
        let (g, first) = match (sig_of(*b), sig_of(*a)) {
            (Some(g), _) if body.var_of(*a) == Some(g) => (g, true),
            (_, Some(g)) if body.var_of(*b) == Some(g) => (g, false),
            _ => return None,
        };
        Some((g, first, 2))
    };
    let ((g, gate_first, n), up, silu_first) = match (silu(args[0]), silu(args[1])) {
        (Some(s), _) => (s, args[1], true),
        (None, Some(s)) => (s, args[0], false),
        _ => return None,
    };
    let (x, wg, None, ng) = dense_core(body, body.f.var(g).expr)? else {
        return None;
    };
    let (xu, wu, None, nu) = dense_core(body, up)? else {
        return None;
    };
    (x == xu).then_some((
        Plan::SiluGated {
            x,
            wg,
            wu,
            order: crate::dense::GateOrder {
                gate_first,
                silu_first,
            },
        },
        1 + n + ng + nu,
    ))
}

/// `squeeze(matmul(gather(w, idx), expand_dims(v, -1)), -1)`, the gather `take(w, idx, axis=0)`
/// or `gather_nd(w, idx, batch_dims=0)`: an expert's matrix-vector product per row (four
/// bindings). Returns `w`, `idx` and `v`.
fn expert_matvec(body: &Body<'_>, e: ExprId) -> Option<(Leaf, Leaf, ExprId)> {
    let last = |axes: &[i64]| matches!(axes, [2] | [-1]);
    let (Op::Squeeze { axis: Some(sq) }, [mv]) = body.call(e, "relax.squeeze")? else {
        return None;
    };
    let (Op::Matmul { out_dtype: None }, [g, col]) = body.call(*mv, "relax.matmul")? else {
        return None;
    };
    let (Op::ExpandDims { axis: ex }, [v]) = body.call(*col, "relax.expand_dims")? else {
        return None;
    };
    if !last(sq) || !last(ex) {
        return None;
    }
    let (w, idx) = match body.call(*g, "relax.take") {
        Some((Op::Take { axis: Some(0), .. }, [w, idx])) => (w, idx),
        Some(_) => return None,
        None => match body.call(*g, "relax.gather_nd")? {
            (Op::GatherNd { batch_dims: 0 }, [w, idx]) => (w, idx),
            _ => return None,
        },
    };
    Some((body.leaf(*w)?, body.leaf(*idx)?, *v))
}

/// `e` as one half of the last axis of a rank-2 `y` (`[.., 2I]`, `2I` known): a strided slice
/// `y[:, a..b]` or an item of `split(y, 2, axis=-1)`. Returns `y`, the half (0 or 1), and the
/// split's var when it is one (its binding is shared by both halves).
fn half_of(body: &Body<'_>, e: ExprId) -> Option<(ExprId, usize, Option<VarId>)> {
    let width = |y: ExprId| match body.dims(y)?[..] {
        [_, ref w] => w.as_static(),
        _ => None,
    };
    if let Some((Op::StridedSlice(a), [y])) = body.call(e, "relax.strided_slice") {
        let w = width(*y)?;
        let unit = a.strides.as_deref().is_none_or(|s| s == [1]);
        if !unit || !matches!(a.axes[..], [1] | [-1]) || w % 2 != 0 {
            return None;
        }
        let half = match (&a.begin[..], &a.end[..]) {
            ([0], [end]) if *end == w / 2 => 0,
            ([begin], [end]) if *begin == w / 2 && *end >= w => 1,
            _ => return None,
        };
        return Some((*y, half, None));
    }
    let v = body.var_of(e)?;
    let (t, i) = *body.items.get(&v)?;
    let (Op::Split(a), [y]) = body.call(t, "relax.split")? else {
        return None;
    };
    let two = a.indices_or_sections == fusebox_core::op::SplitSpec::Sections(2);
    if !two || !matches!(a.axis, 1 | -1) || width(*y)? % 2 != 0 || i > 1 {
        return None;
    }
    Some((*y, i as usize, body.var_of(t)))
}

fn moe_silu_gated(body: &Body<'_>, ret: ExprId) -> Option<(Plan, usize)> {
    let (wd, idx, h) = expert_matvec(body, ret)?;
    // h = multiply(multiply(g, sigmoid(g)), u), either operand order in both.
    let (_, outer) = body.call(h, "relax.multiply")?;
    let silu_of = |e: ExprId| -> Option<(ExprId, bool)> {
        let (_, [a, b]) = body.call(e, "relax.multiply")? else {
            return None;
        };
        let sig = |s: ExprId, g: ExprId| {
            let (_, [x]) = body.call(s, "relax.sigmoid")? else {
                return None;
            };
            (body.var_of(*x)? == body.var_of(g)?).then_some(())
        };
        if sig(*b, *a).is_some() {
            Some((*a, true))
        } else {
            sig(*a, *b).map(|()| (*b, false))
        }
    };
    let ((g, gate_first), u) = body.either(outer, silu_of)?;
    let silu_first = body.var_of(outer[0]) != body.var_of(u);
    let (yg, gate_half, gsplit) = half_of(body, g)?;
    let (yu, up_half, usplit) = half_of(body, u)?;
    if body.var_of(yg)? != body.var_of(yu)? || gate_half == up_half || gsplit != usplit {
        return None;
    }
    let (wgu, idx2, x) = expert_matvec(body, yg)?;
    if idx2 != idx {
        return None;
    }
    let x = body.leaf(x)?;
    // Two matrix-vector products (4 bindings each), the SiLU's sigmoid and two multiplies,
    // and the halves: two slices, or two items and their split.
    let used = 4 + 3 + 4 + if gsplit.is_some() { 3 } else { 2 };
    Some((
        Plan::MoeSiluGated {
            x,
            idx,
            wgu,
            wd,
            spec: crate::moe::MoeSpec {
                gate_half,
                order: crate::dense::GateOrder {
                    gate_first,
                    silu_first,
                },
            },
        },
        used,
    ))
}

/// RoPE: `add(multiply(x, cos), multiply(concat((negative(x[h..end]), x[..h])), sin))`, the
/// slices of one `x` on one axis with stride 1, either operand order in the multiplies and the
/// add.
fn rope(body: &Body<'_>, ret: ExprId) -> Option<(Plan, usize)> {
    let (_, [a, b]) = body.call(ret, "relax.add")? else {
        return None;
    };
    // `multiply(concat(...), sin)`: (x, sin, half, end, axes, rotated first, tuple bound).
    type Rotated = (Leaf, Leaf, i64, i64, [i64; 2], bool, bool);
    let rotated = |e: ExprId| -> Option<Rotated> {
        let (_, [p, q]) = body.call(e, "relax.multiply")? else {
            return None;
        };
        // (x, half, end, [slices' axis, concat's axis], whether the tuple is a binding of its own).
        let concat = |c: ExprId| -> Option<(Leaf, i64, i64, [i64; 2], bool)> {
            let (Op::Concat { axis: Some(axis) }, [t]) = body.call(c, "relax.concat")? else {
                return None;
            };
            let (fs, bound) = match &body.f.exprs.get(*t)?.kind {
                ExprKind::Tuple(fs) => (fs.as_slice(), false),
                ExprKind::Var(v) => (*body.tuples.get(v)?, true),
                _ => return None,
            };
            let [neg, first] = fs else {
                return None;
            };
            let (_, [second]) = body.call(*neg, "relax.negative")? else {
                return None;
            };
            // A stride-1 slice of a leaf on one axis: (leaf, axis, begin, end).
            let slice = |e: ExprId| -> Option<(Leaf, i64, i64, i64)> {
                let (Op::StridedSlice(s), [x]) = body.call(e, "relax.strided_slice")? else {
                    return None;
                };
                let unit = s.strides.as_deref().is_none_or(|v| v == [1]);
                match (s.axes.as_slice(), s.begin.as_slice(), s.end.as_slice()) {
                    ([ax], [b], [e]) if unit => Some((body.leaf(*x)?, *ax, *b, *e)),
                    _ => None,
                }
            };
            let (x1, ax1, b1, e1) = slice(*first)?;
            let (x2, ax2, b2, e2) = slice(*second)?;
            let ok = x1 == x2 && ax1 == ax2 && b1 == 0 && b2 == e1 && e1 > 0;
            ok.then_some((x1, e1, e2, [ax1, *axis], bound))
        };
        let ((x, half, end, axis, bound), sin, first) = match (concat(*p), concat(*q)) {
            (Some(c), _) => (c, *q, true),
            (None, Some(c)) => (c, *p, false),
            _ => return None,
        };
        Some((x, body.leaf(sin)?, half, end, axis, first, bound))
    };
    let ((x, sin, half, end, axes, rotated_first, bound), other, cos_first) =
        match (rotated(*b), rotated(*a)) {
            (Some(r), _) => (r, *a, true),
            (None, Some(r)) => (r, *b, false),
            _ => return None,
        };
    let (_, [p, q]) = body.call(other, "relax.multiply")? else {
        return None;
    };
    let (cos, x_first) = match (body.leaf(*p), body.leaf(*q)) {
        (Some(l), Some(c)) if l == x => (c, true),
        (Some(c), Some(l)) if l == x => (c, false),
        _ => return None,
    };
    let order = crate::rope::RopeOrder {
        x_first,
        rotated_first,
        cos_first,
    };
    let plan = Plan::Rope {
        x,
        cos,
        sin,
        half,
        end,
        axes,
        order,
    };
    // add, two multiplies, concat, negative, two slices (and the tuple, if bound).
    Some((plan, 7 + usize::from(bound)))
}

/// A plan's inputs' values, `f32` tensors on the host only.
fn f32_tensor(v: &Value) -> Option<&Tensor> {
    match v {
        Value::Tensor(t) if t.dtype() == DType::F32 => Some(t),
        _ => None,
    }
}

/// The packed copy the executor keeps of a constant weight for a product with an input
/// (`Packed(x, w)`; `None`: not a kept constant, or too few rows; see
/// [`crate::gemm_packed`]).
pub(crate) type Packed<'p> =
    &'p dyn Fn(&Tensor, &Tensor) -> Option<std::sync::Arc<crate::gemm_packed::PackedB>>;

/// Runs `plan` with `input` giving each leaf's value; `Ok(None)` when the values do not fit.
pub(crate) fn run(
    plan: &Plan,
    input: &dyn Fn(Leaf) -> crate::Result<Value>,
    packed: Packed<'_>,
) -> crate::Result<Option<Value>> {
    let get = |l: Leaf| -> crate::Result<Option<Tensor>> { Ok(f32_tensor(&input(l)?).cloned()) };
    // An optional input: `None` when it is given but does not fit, `Some(None)` when absent.
    let opt = |l: &Option<Leaf>| -> crate::Result<Option<Option<Tensor>>> {
        match l {
            Some(l) => Ok(get(*l)?.map(Some)),
            None => Ok(Some(None)),
        }
    };
    let kernel = |op: &'static str| move |message: String| crate::Error::Kernel { op, message };
    Ok(match plan {
        Plan::Attention { .. } => attention::run(plan, input)?,
        Plan::ResidualLayerNorm {
            a,
            b,
            gamma,
            beta,
            eps,
            outputs,
        } => {
            let (Some(a), Some(b), Some(g), Some(be)) =
                (get(*a)?, get(*b)?, opt(gamma)?, opt(beta)?)
            else {
                return Ok(None);
            };
            let Some((sum, norm)) =
                crate::norm::residual_layer_norm(&a, &b, g.as_ref(), be.as_ref(), *eps)
                    .map_err(kernel("cpu.residual_layer_norm"))?
            else {
                return Ok(None);
            };
            let mut vals: Vec<Value> = outputs
                .iter()
                .map(|&n| Value::Tensor(if n { norm.clone() } else { sum.clone() }))
                .collect();
            if vals.len() == 1 {
                vals.pop()
            } else {
                Some(Value::Tuple(vals))
            }
        }
        Plan::RmsNorm { x, weight, eps } => {
            let Some(x) = get(*x)? else { return Ok(None) };
            let Some(w) = opt(weight)? else {
                return Ok(None);
            };
            crate::norm::rms_norm(&x, w.as_ref(), *eps)
                .map_err(kernel("cpu.rms_norm"))?
                .map(Value::Tensor)
        }
        Plan::Gelu { x, tanh } => {
            let Some(x) = get(*x)? else { return Ok(None) };
            Some(Value::Tensor(
                crate::norm::gelu(&x, *tanh).map_err(kernel("cpu.gelu"))?,
            ))
        }
        Plan::Dense { x, w, bias, act } => {
            let (Some(x), Some(w)) = (get(*x)?, get(*w)?) else {
                return Ok(None);
            };
            let Some(b) = opt(bias)? else {
                return Ok(None);
            };
            crate::dense::dense(&x, &w, b.as_ref(), *act, packed(&x, &w).as_deref())
                .map_err(kernel("cpu.dense"))?
                .map(Value::Tensor)
        }
        Plan::LayerNormDecomposed {
            x,
            exp,
            eps,
            gamma,
            beta,
        } => {
            let Some(x) = get(*x)? else { return Ok(None) };
            let (Some(g), Some(b)) = (opt(gamma)?, opt(beta)?) else {
                return Ok(None);
            };
            crate::norm::layer_norm_decomposed(&x, *exp, *eps, g.as_ref(), b.as_ref())
                .map_err(kernel("cpu.layer_norm_decomposed"))?
                .map(Value::Tensor)
        }
        Plan::SiluGated { x, wg, wu, order } => {
            let (Some(x), Some(wg), Some(wu)) = (get(*x)?, get(*wg)?, get(*wu)?) else {
                return Ok(None);
            };
            let (pg, pu) = (packed(&x, &wg), packed(&x, &wu));
            crate::dense::silu_gated(&x, &wg, &wu, *order, (pg.as_deref(), pu.as_deref()))
                .map_err(kernel("cpu.silu_gated"))?
                .map(Value::Tensor)
        }
        Plan::Rope {
            x,
            cos,
            sin,
            half,
            end,
            axes,
            order,
        } => {
            let (Some(x), Some(c), Some(s)) = (get(*x)?, get(*cos)?, get(*sin)?) else {
                return Ok(None);
            };
            // The slices must halve the last axis: x[..h] and x[h..] (an end past it clamps).
            let rank = x.shape().len() as i64;
            let d = x.shape().last().map_or(0, |&d| d as i64);
            let last = axes.iter().all(|&a| a == -1 || a == rank - 1);
            if !last || *half * 2 != d || *end < d {
                return Ok(None);
            }
            let Ok(h) = usize::try_from(*half) else {
                return Ok(None);
            };
            crate::rope::rope(&x, &c, &s, h, *order)
                .map_err(kernel("cpu.rope"))?
                .map(Value::Tensor)
        }
        Plan::MoeSiluGated {
            x,
            idx,
            wgu,
            wd,
            spec,
        } => {
            let (Some(x), Some(wgu), Some(wd)) = (get(*x)?, get(*wgu)?, get(*wd)?) else {
                return Ok(None);
            };
            let Value::Tensor(idx) = input(*idx)? else {
                return Ok(None);
            };
            crate::moe::moe_silu_gated(&x, &idx, &wgu, &wd, spec)
                .map_err(kernel("cpu.moe_silu_gated"))?
                .map(Value::Tensor)
        }
    })
}
