//! The attention forms of [`super::recognise`] and their run: scaled dot-product attention as the
//! exporters write it, with the heads' transposes (`cpu.attention_heads`), the grouped-query
//! heads' `repeat_kv` (`cpu.attention_grouped`), the scores viewed around a select
//! (`cpu.attention_reshaped`) or einsums (`cpu.attention_einsum`), all run by
//! [`crate::attention::attention_permuted`] without a `[S, T]` score tensor. The forms, in text
//! IR, are in [`super`]'s docs; this file holds their matching and the run-time checks that the
//! values fit the kernel (else the caller interprets the body op by op).

use super::{Body, Leaf, Plan};
use crate::attention::{AttnSpec, Scale};
use fusebox_core::ir::{DType, ExprId, ExprKind};
use fusebox_core::op::Op;
use fusebox_core::op::einsum::EinsumSpec;
use fusebox_core::runtime::{Tensor, Value};

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

/// The attention forms (see [`super`]'s docs) rooted at `ret`: the plan and how many bindings
/// it used.
pub(super) fn recognise(body: &Body<'_>, ret: ExprId) -> Option<(Plan, usize)> {
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

/// Runs a [`Plan::Attention`] with `input` giving each leaf's value; `Ok(None)` when the values
/// do not fit the kernel (or `plan` is another plan).
pub(super) fn run(
    plan: &Plan,
    input: &dyn Fn(Leaf) -> crate::Result<Value>,
) -> crate::Result<Option<Value>> {
    let Plan::Attention {
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
    } = plan
    else {
        return Ok(None);
    };
    let get =
        |l: Leaf| -> crate::Result<Option<Tensor>> { Ok(super::f32_tensor(&input(l)?).cloned()) };
    let kernel = |op: &'static str| move |message: String| crate::Error::Kernel { op, message };
    let (Some(q), Some(kt), Some(v)) = (get(*q)?, get(*kt)?, get(*v)?) else {
        return Ok(None);
    };
    // A repeated kᵀ or v is read as is, with its fewer heads, where the repeat's
    // targets are the grouped heads' repeat to q's head count and kᵀ's permutation
    // keeps the head dim in place.
    for (rep, (x, perm)) in repeats.iter().zip([(&kt, &perms[1]), (&v, &perms[2])]) {
        let Some(rep) = rep else { continue };
        let (Value::Shape(b), Value::Shape(mut s)) = (input(rep.broadcast)?, input(rep.reshape)?)
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
    Ok(crate::attention::attention_permuted(
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
    .map(Value::Tensor))
}
