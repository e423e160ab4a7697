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

use crate::attention::{AttnSpec, Scale};
use fusebox_core::ir::{Callee, DType, ExprId, ExprKind, Function, VarId};
use fusebox_core::op::Op;
use fusebox_core::op::einsum::EinsumSpec;
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
    if let Some((plan, used)) = attention(&body, ret)
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

/// An operand: an input, or `permute_dims` of one with explicit axes (the axes as
/// indices), with the bindings it used.
type PermutedLeaf = (Leaf, Option<Vec<usize>>, usize);

/// Hugging Face's `repeat_kv` for grouped-query attention as both exporters write it,
/// `reshape(broadcast_to(expand_dims(x, axis=[r - 2]), b), s)` for `x: [.., Hkv, S, D]` of
/// rank `r ≥ 3`: `b = [.., Hkv, n, S, D]` and `s = [.., Hkv·n, S, D]`, so head `h` of the
/// result is head `h / n` of `x`, which is how the attention kernel reads a `kᵀ` or `v` with
/// fewer heads than `q`. The two targets are checked against `x`'s shape at run time
/// ([`repeat_fits`]); anything else runs the body op by op.
///
/// The dynamo exporter's keys have their transpose inside instead, between the broadcast and
/// the reshape: `reshape(permute_dims(b, axes), s)` with `axes` keeping the two head axes
/// in place (`[0, 1, 2, 4, 3]`), `s` the permuted shape. That is the same repeat of `x`
/// permuted by `axes` without its new axis (`[0, 1, 3, 2]`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Repeat {
    /// The `broadcast_to` target.
    broadcast: Leaf,
    /// The `reshape` target.
    reshape: Leaf,
    /// Whether the reshape target is of the permuted tensor (the transpose inside).
    permuted: bool,
}

/// `e` as the repeat of [`Repeat`]: the repeated operand, the repeat, and the bindings used.
fn repeated(body: &Body<'_>, e: ExprId) -> Option<(ExprId, Repeat, usize)> {
    let (_, [b, rs]) = body.call(e, "relax.reshape")? else {
        return None;
    };
    let (x, broadcast, _) = new_head_axis(body, *b)?;
    let repeat = Repeat {
        broadcast,
        reshape: body.leaf(*rs)?,
        permuted: false,
    };
    Some((x, repeat, 3))
}

/// `broadcast_to(expand_dims(x, axis=[r - 2]), b)` bound to `e` (`x` of rank `r ≥ 3`; the
/// axis also counted from the end): `x`, the target `b` and `r`.
fn new_head_axis(body: &Body<'_>, e: ExprId) -> Option<(ExprId, Leaf, usize)> {
    let (_, [x1, bs]) = body.call(e, "relax.broadcast_to")? else {
        return None;
    };
    let (Op::ExpandDims { axis }, [x]) = body.call(*x1, "relax.expand_dims")? else {
        return None;
    };
    let r = body.rank(*x)?;
    let at = match axis[..] {
        [a] if a >= 0 => usize::try_from(a).ok()?,
        [a] => (r as i64 + 1 + a).try_into().ok()?,
        _ => return None,
    };
    (r >= 3 && at == r - 2).then_some(())?;
    Some((*x, body.leaf(*bs)?, r))
}

/// `e` as the dynamo form of [`Repeat`], `reshape(permute_dims(broadcast_to(expand_dims(x,
/// axis=[r - 2]), b), axes), s)`, where `axes` keeps the new axis and the heads' axis in
/// place: the repeated operand, its permutation (`axes` without the new axis), the repeat,
/// and the bindings used.
fn repeated_permuted(body: &Body<'_>, e: ExprId) -> Option<(ExprId, Vec<usize>, Repeat, usize)> {
    let (_, [p, rs]) = body.call(e, "relax.reshape")? else {
        return None;
    };
    let (op, [b]) = body.call(*p, "relax.permute_dims")? else {
        return None;
    };
    let axes = axes_of(op)?;
    let (x, broadcast, r) = new_head_axis(body, *b)?;
    if axes.len() != r + 1 {
        return None;
    }
    // The heads' axis and the new one stay where they are, so the reshape merges them.
    let (h, n) = (r - 3, r - 2);
    if axes[h] != h || axes[n] != n {
        return None;
    }
    let perm: Vec<usize> = axes
        .iter()
        .filter(|&&a| a != n)
        .map(|&a| if a > n { a - 1 } else { a })
        .collect();
    let repeat = Repeat {
        broadcast,
        reshape: body.leaf(*rs)?,
        permuted: true,
    };
    Some((x, perm, repeat, 4))
}

/// Whether the repeat's targets, at run time, are the grouped heads' repeat of `x` (shape
/// `xs`) by some `n ≥ 1` (see [`Repeat`]), giving `heads` heads: `b` is `xs` with `n` inserted
/// before its second-to-last dim, `s` is `xs` with its head dim (third from last) times `n`.
fn repeat_fits(xs: &[usize], b: &[i64], s: &[i64], heads: usize) -> bool {
    let r = xs.len();
    if r < 3 || b.len() != r + 1 || s.len() != r {
        return false;
    }
    // (`s` in `x`'s dim order: the caller puts a permuted target back.)
    let h = r - 3;
    let Ok(n) = usize::try_from(b[r - 2]) else {
        return false;
    };
    let same = |t: i64, d: usize| usize::try_from(t).is_ok_and(|t| t == d);
    n >= 1
        && (0..r).all(|i| same(b[if i < r - 2 { i } else { i + 1 }], xs[i]))
        && (0..r).all(|i| i == h || same(s[i], xs[i]))
        && xs[h].checked_mul(n) == Some(heads)
        && same(s[h], heads)
}

fn permuted(body: &Body<'_>, e: ExprId) -> Option<PermutedLeaf> {
    if let Some((op, [x])) = body.call(e, "relax.permute_dims") {
        return Some((body.leaf(*x)?, Some(axes_of(op)?), 1));
    }
    Some((body.leaf(e)?, None, 0))
}

/// A `permute_dims`' explicit, non-negative axes (the kernel checks they permute).
fn axes_of(op: &Op) -> Option<Vec<usize>> {
    let Op::PermuteDims { axes: Some(axes) } = op else {
        return None;
    };
    axes.iter().map(|&a| usize::try_from(a).ok()).collect()
}

/// A scaled operand `x * c`, `x / c` or `x` (`x` as [`permuted`] reads it), with the
/// bindings it used.
fn scaled(body: &Body<'_>, e: ExprId) -> Option<(PermutedLeaf, Scale)> {
    let (x, scale, n) = unscaled(body, e)?;
    let (leaf, perm, m) = permuted(body, x)?;
    Some(((leaf, perm, n + m), scale))
}

/// `x * c`, `c * x` or `x / c` (`c` a scalar constant) bound to `e`: `x`, the scale and the
/// bindings used; `e` itself, no scale and none for anything else.
fn unscaled(body: &Body<'_>, e: ExprId) -> Option<(ExprId, Scale, usize)> {
    Some(if let Some((_, args)) = body.call(e, "relax.multiply") {
        let (c, x) = body.either(args, |a| body.scalar(a))?;
        (x, Scale::Mul(c), 1)
    } else if let Some((_, args)) = body.call(e, "relax.divide") {
        (args[0], Scale::Div(body.scalar(args[1])?), 1)
    } else {
        (e, Scale::None, 0)
    })
}

/// A scaled operand (as [`scaled`]) whose input, under its `permute_dims`, is the grouped
/// heads' [`Repeat`] of a leaf: the leaf (permuted as the repeat's result was), the scale, the
/// repeat, and the bindings used.
fn scaled_repeated(body: &Body<'_>, e: ExprId) -> Option<(PermutedLeaf, Scale, Repeat)> {
    let (x, scale, n) = unscaled(body, e)?;
    if let Some((leaf, perm, rep, k)) = repeated_permuted(body, x) {
        return Some(((body.leaf(leaf)?, Some(perm), n + k), scale, rep));
    }
    let (x, perm, m) = match body.call(x, "relax.permute_dims") {
        Some((op, [y])) => (*y, Some(axes_of(op)?), 1),
        Some(_) => return None,
        None => (x, None, 0),
    };
    let (leaf, rep, k) = repeated(body, x)?;
    Some(((body.leaf(leaf)?, perm, n + m + k), scale, rep))
}

/// A two-operand `einsum((a, b))` bound to `e`: the operands and the parsed equation (the
/// ranks from their types).
fn einsum2(body: &Body<'_>, e: ExprId) -> Option<(ExprId, ExprId, EinsumSpec)> {
    let (Op::Einsum { subscripts }, [t]) = body.call(e, "relax.einsum")? else {
        return None;
    };
    let ExprKind::Tuple(xs) = &body.f.exprs.get(*t)?.kind else {
        return None;
    };
    let [a, b] = xs.as_slice() else { return None };
    let spec = EinsumSpec::parse(subscripts, &[body.rank(*a)?, body.rank(*b)?]).ok()?;
    Some((*a, *b, spec))
}

/// Where each label of `ls` is (labels distinct), as dim indices of the operand.
fn positions(ls: &[usize], order: &[usize]) -> Option<Vec<usize>> {
    let distinct = ls.iter().enumerate().all(|(i, l)| !ls[..i].contains(l));
    if !distinct || order.len() != ls.len() {
        return None;
    }
    order
        .iter()
        .map(|l| ls.iter().position(|x| x == l))
        .collect()
}

/// The scores' einsum `(q, k) -> [batch.., S, T]` as the attention kernel reads it: the
/// permutation giving `q` as `[batch.., S, D]` and `k` as `kᵀ = [batch.., D, T]`. Every batch
/// label in both operands, one summed label `D`, `S` only in `q`, `T` only in `k`.
fn qk_perms(spec: &EinsumSpec) -> Option<(Vec<usize>, Vec<usize>)> {
    let ([la, lb], out) = (spec.inputs.as_slice(), &spec.output) else {
        return None;
    };
    let r = out.len();
    if r < 2 {
        return None;
    }
    let (batch, s, t) = (&out[..r - 2], out[r - 2], out[r - 1]);
    let summed: Vec<usize> = la
        .iter()
        .copied()
        .filter(|l| lb.contains(l) && !out.contains(l))
        .collect();
    let [d] = summed[..] else { return None };
    let ok = batch.iter().all(|l| la.contains(l) && lb.contains(l))
        && la.contains(&s)
        && !lb.contains(&s)
        && lb.contains(&t)
        && !la.contains(&t);
    if !ok {
        return None;
    }
    let mut qo = batch.to_vec();
    qo.extend([s, d]);
    let mut ko = batch.to_vec();
    ko.extend([d, t]);
    Some((positions(la, &qo)?, positions(lb, &ko)?))
}

/// The product's einsum `(p, v) -> out`, `p` the probabilities `[batch.., S, T]` in the
/// scores' order: the permutation giving `v` as `[batch.., T, Dv]`, and the output's order of
/// the kernel's `[batch.., S, Dv]`.
fn pv_perms(spec: &EinsumSpec) -> Option<(Vec<usize>, Vec<usize>)> {
    let ([lp, lv], out) = (spec.inputs.as_slice(), &spec.output) else {
        return None;
    };
    let r = lp.len();
    if r < 2 || out.len() != r {
        return None;
    }
    let (batch, s, t) = (&lp[..r - 2], lp[r - 2], lp[r - 1]);
    let extra: Vec<usize> = lv.iter().copied().filter(|l| !lp.contains(l)).collect();
    let [dv] = extra[..] else { return None };
    let ok = batch.iter().all(|l| lv.contains(l) && out.contains(l))
        && lv.contains(&t)
        && !out.contains(&t)
        && out.contains(&s)
        && !lv.contains(&s)
        && out.contains(&dv);
    if !ok {
        return None;
    }
    let mut vo = batch.to_vec();
    vo.extend([t, dv]);
    let mut logical = batch.to_vec();
    logical.extend([s, dv]);
    Some((positions(lv, &vo)?, positions(&logical, out)?))
}

fn attention(body: &Body<'_>, ret: ExprId) -> Option<(Plan, usize)> {
    let mut used = 1;
    let (mut k_repeat, mut v_repeat) = (None, None);
    let (out_perm, ret) = match body.call(ret, "relax.permute_dims") {
        Some((op, [x])) => {
            used += 1;
            (Some(axes_of(op)?), *x)
        }
        Some(_) => return None,
        None => (None, ret),
    };
    // The product with `v`: a matmul (of a `permute_dims` of v, maybe), or an einsum that is
    // one between permutations (LongT5's local attention: `...hqk,...khd->...qhd`).
    let (p, v, v_perm, out_perm) = if let Some((pe, ve, spec)) = einsum2(body, ret) {
        let (v_perm, o) = pv_perms(&spec)?;
        if out_perm.is_some() {
            return None;
        }
        (pe, body.leaf(ve)?, Some(v_perm), Some(o))
    } else {
        let (Op::Matmul { out_dtype: None }, [p, v]) = body.call(ret, "relax.matmul")? else {
            return None;
        };
        let (v, v_perm, n) = match repeated(body, *v) {
            Some((x, rep, m)) => {
                used += m;
                v_repeat = Some(rep);
                (body.leaf(x)?, None, 0)
            }
            None => permuted(body, *v)?,
        };
        used += n;
        (*p, v, v_perm, out_perm)
    };
    // DeBERTa's view: the probabilities reshaped back from `[B, H, S, T]` to the scores'
    // `[B·H, S, T]` (checked below against the reshape that made the view).
    let (p, back) = match body.call(p, "relax.reshape") {
        Some((_, [x, _])) => {
            used += 1;
            (*x, Some(p))
        }
        Some(_) => return None,
        None => (p, None),
    };
    // The NaN guard: where(isnan(sm), 0, sm).
    let (sm, nan_guard) = match body.call(p, "relax.where") {
        Some((_, [c, zero, sm])) => {
            let (_, [sm2]) = body.call(*c, "relax.isnan")? else {
                return None;
            };
            if body.var_of(*sm2)? != body.var_of(*sm)? || body.scalar(*zero)? != 0.0 {
                return None;
            }
            used += 2;
            (*sm, true)
        }
        Some(_) => return None,
        None => (p, false),
    };
    let (Op::Softmax { axis }, [x]) = body.call(sm, "relax.nn.softmax")? else {
        return None;
    };
    let rank = body.rank(sm)?;
    if *axis != -1 && *axis != rank as i64 - 1 {
        return None;
    }
    used += 1;
    // A select mask: where(cond, fill, scores), cond an input.
    let mut scores = *x;
    let mut select = None;
    if let Some((_, [c, fill, inner])) = body.call(scores, "relax.where") {
        let fill = body.scalar(*fill)?;
        if !(fill.is_finite() || fill == f32::NEG_INFINITY) {
            return None;
        }
        select = Some((body.leaf(*c)?, fill));
        used += 1;
        scores = *inner;
    }
    // The view the select and the softmax saw: `reshape(scores, [B, H, S, T])`, its last two
    // dims the scores' own and the reshape back giving the scores' shape, so batch index `n`
    // of the scores is index `n` of the view's batch dims in row-major order.
    let mut select_view = None;
    if let Some(back) = back {
        let (_, [x, _]) = body.call(scores, "relax.reshape")? else {
            return None;
        };
        let (vd, sd, bd) = (body.dims(scores)?, body.dims(*x)?, body.dims(back)?);
        let (rv, rs) = (vd.len(), sd.len());
        if rv < 2 || rs < 2 || bd[..] != sd[..] || vd[rv - 2..] != sd[rs - 2..] {
            return None;
        }
        select_view = Some(
            vd[..rv - 2]
                .iter()
                .map(|d| d.as_static().and_then(|v| usize::try_from(v).ok()))
                .collect::<Vec<_>>(),
        );
        used += 1;
        scores = *x;
    }
    // Up to two additive masks: add(add(scores, m1), m2).
    let mut masks = Vec::new();
    while let Some((_, args)) = body.call(scores, "relax.add") {
        if masks.len() == 2 {
            return None;
        }
        let is_inner = |e: ExprId| {
            [
                "relax.matmul",
                "relax.einsum",
                "relax.add",
                "relax.divide",
                "relax.multiply",
            ]
            .iter()
            .any(|op| body.call(e, op).is_some())
            .then_some(e)
        };
        let (inner, m) = body.either(args, is_inner)?;
        masks.push(body.leaf(m)?);
        used += 1;
        scores = inner;
    }
    masks.reverse();
    // A scale after the product (eager attention: `matmul(q, kᵀ) / √d`) is a scale of q (or
    // of kᵀ when q has one): the same product up to rounding.
    let mut post = Scale::None;
    if let Some((_, [m, c])) = body.call(scores, "relax.divide") {
        post = Scale::Div(body.scalar(*c)?);
        scores = *m;
        used += 1;
    } else if let Some((_, args)) = body.call(scores, "relax.multiply") {
        let (c, m) = body.either(args, |a| body.scalar(a))?;
        post = Scale::Mul(c);
        scores = m;
        used += 1;
    }
    used += 1;
    let ((q, q_perm), mut q_scale, (kt, k_perm), mut k_scale) = if let Some((qe, ke, spec)) =
        einsum2(body, scores)
    {
        let (pq, pk) = qk_perms(&spec)?;
        let (q, k) = (body.leaf(qe)?, body.leaf(ke)?);
        ((q, Some(pq)), Scale::None, (k, Some(pk)), Scale::None)
    } else {
        let (Op::Matmul { out_dtype: None }, [qs, ks]) = body.call(scores, "relax.matmul")? else {
            return None;
        };
        let ((q, q_perm, n), q_scale) = scaled(body, *qs)?;
        used += n;
        let ((kt, k_perm, n), k_scale) = match scaled_repeated(body, *ks) {
            Some((pl, scale, rep)) => {
                k_repeat = Some(rep);
                (pl, scale)
            }
            None => scaled(body, *ks)?,
        };
        used += n;
        ((q, q_perm), q_scale, (kt, k_perm), k_scale)
    };
    if !matches!(post, Scale::None) {
        if matches!(q_scale, Scale::None) {
            q_scale = post;
        } else if matches!(k_scale, Scale::None) {
            k_scale = post;
        } else {
            return None;
        }
    }
    let spec = AttnSpec {
        q_scale,
        k_scale,
        nan_guard,
        causal: None,
    };
    Some((
        Plan::Attention {
            q,
            kt,
            v,
            masks,
            select,
            select_view,
            spec,
            perms: [q_perm, k_perm, v_perm],
            repeats: Box::new([k_repeat, v_repeat]),
            out_perm,
        },
        used,
    ))
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
        Plan::Attention {
            q,
            kt,
            v,
            masks,
            select,
            select_view,
            spec,
            perms,
            repeats,
            out_perm,
        } => {
            let (Some(q), Some(kt), Some(v)) = (get(*q)?, get(*kt)?, get(*v)?) else {
                return Ok(None);
            };
            // A repeated kᵀ or v is read as is, with its fewer heads, where the repeat's
            // targets are the grouped heads' repeat to q's head count and kᵀ's permutation
            // keeps the head dim in place.
            for (rep, (x, perm)) in repeats.iter().zip([(&kt, &perms[1]), (&v, &perms[2])]) {
                let Some(rep) = rep else { continue };
                let (Value::Shape(b), Value::Shape(mut s)) =
                    (input(rep.broadcast)?, input(rep.reshape)?)
                else {
                    return Ok(None);
                };
                let r = x.shape().len();
                // A target of the permuted tensor, put back in x's dim order.
                if rep.permuted {
                    match perm {
                        Some(p) if p.len() == r && s.len() == r => {
                            let mut back = vec![-1; r];
                            for (&a, &d) in p.iter().zip(&s) {
                                match back.get_mut(a) {
                                    Some(slot) => *slot = d,
                                    None => return Ok(None),
                                }
                            }
                            s = back;
                        }
                        _ => return Ok(None),
                    }
                }
                let q_heads = match (r.checked_sub(3), &perms[0]) {
                    (Some(h), Some(p)) if p.len() == r => p.get(h).and_then(|&a| q.shape().get(a)),
                    (Some(h), None) => q.shape().get(h),
                    _ => None,
                };
                let keeps_heads = perm
                    .as_ref()
                    .is_none_or(|p| r >= 3 && p.get(r - 3) == Some(&(r - 3)));
                match q_heads {
                    Some(&hq) if keeps_heads && repeat_fits(x.shape(), &b, &s, hq) => {}
                    _ => return Ok(None),
                }
            }
            let select = match select {
                Some((c, fill)) => match input(*c)? {
                    Value::Tensor(t) if t.dtype() == DType::Bool => Some((t, *fill)),
                    _ => return Ok(None),
                },
                None => None,
            };
            let mut ms = Vec::new();
            for m in masks {
                match get(*m)? {
                    Some(t) => ms.push(t),
                    None => return Ok(None),
                }
            }
            let ms: Vec<&Tensor> = ms.iter().collect();
            let [pq, pk, pv] = perms.each_ref().map(|p| p.as_deref());
            crate::attention::attention_permuted(
                crate::attention::Operand { t: &q, perm: pq },
                crate::attention::Operand { t: &kt, perm: pk },
                crate::attention::Operand { t: &v, perm: pv },
                &ms,
                select.as_ref().map(|(t, f)| crate::attention::SelectMask {
                    cond: t,
                    fill: *f,
                    view: select_view.as_deref(),
                }),
                spec,
                out_perm.as_deref(),
            )
            .map_err(kernel("cpu.attention"))?
            .map(Value::Tensor)
        }
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
