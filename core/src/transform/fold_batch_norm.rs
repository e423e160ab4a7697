//! FoldBatchNorm: inference-mode `batch_norm` with constant statistics becomes a per-channel
//! affine map, folded into the preceding `conv2d`'s or `matmul`'s weights where it can be.
//!
//! Contract:
//!
//! - **Requires** a module that verifies.
//! - **Rewrites**, in every function without `Primitive`, `Composite` or `Codegen`, each
//!   `bn = R.nn.batch_norm(x, gamma, beta, mean, var)` with `training = False` whose four
//!   statistics are float32 constants (inline, or vars bound to constants), whose only uses are
//!   `bn[0]`, and whose `x` is a float32 tensor of known rank with the channel axis in range.
//!   With `s = gamma / sqrt(var + epsilon)` and `t = beta - mean * s` (computed in f64):
//!   - when `x` is `R.nn.conv2d(data, w)` with a float32 constant weight, layouts `NCHW` /
//!     `OIHW` / `NCHW`, no `out_dtype` other than float32, the channel axis 1, and no use of
//!     `x` but `bn`: the weight becomes `w[o] * s[o]` and `bn[0]` becomes `R.add(x, t)` (`t`
//!     shaped `[1, C, 1, 1]`), so FuseOps puts the conv, this bias and what follows (ReLU,
//!     a residual add) in one group;
//!   - when `x` is `R.matmul(data, w)` with a 2-d float32 constant weight `[K, C]`, no
//!     `out_dtype` other than float32, the channel axis the last one, and no use of `x` but
//!     `bn`: the weight becomes `w[:, n] * s[n]` and `bn[0]` becomes `R.add(x, t)` (`t`
//!     shaped `[1, …, 1, C]`), a dense layer with a bias;
//!   - otherwise `bn` becomes `R.multiply(x, s)` and `bn[0]` becomes `R.add(that, t)`
//!     (elementwise ops FuseOps fuses with their neighbours).
//! - Types, names and the origins of the bindings are kept; the `bn` binding's var is reused
//!   for the multiply (or dropped when the scale went into the weights). Anything else is
//!   left as it is. The result equals the unfolded module up to float rounding (the tests
//!   compare both on the CPU reference).
//!
//! ```text
//! ; before
//! c = R.nn.conv2d(x, metadata["relax.expr.Constant"][0])
//! bn = R.nn.batch_norm(c, g, b, m, v, axis=1, epsilon=1e-5)      ; g, b, m, v constants
//! y = bn[0]
//! ; after
//! c = R.nn.conv2d(x, metadata["relax.expr.Constant"][4])          ; w * s per output channel
//! y = R.add(c, metadata["relax.expr.Constant"][5])                ; t, shape [1, C, 1, 1]
//! ```

use super::fuse_ops_by_pattern::is_entry;
use crate::error::Result;
use crate::ir::{
    Binding, Callee, Constant, DType, ExprId, ExprKind, Function, Module, Type, VarId,
};
use crate::op::Op;
use crate::pattern::matcher::FunctionView;

/// Runs FoldBatchNorm (see the module doc).
/// Inside the branches of `if`s too (see [`super::regions`]).
pub fn fold_batch_norm(m: &Module) -> Result<Module> {
    super::regions::map_regions(m, fold_batch_norm_flat)
}

fn fold_batch_norm_flat(m: &Module) -> Result<Module> {
    let mut out = m.clone();
    for (_, f) in out.functions.iter_mut() {
        if is_entry(f) {
            fold_in(f);
        }
    }
    Ok(out)
}

/// One batch_norm to rewrite.
struct Site {
    /// The batch_norm binding's var.
    bn: VarId,
    /// The input expression of the batch_norm.
    x: ExprId,
    /// The conv2d binding to fold the scale into: its var, its value (the call), its data and
    /// its weight.
    conv: Option<(VarId, ExprId, ExprId, Constant, ChannelAxis)>,
    /// Per-channel scale and shift.
    scale: Vec<f64>,
    shift: Vec<f64>,
    /// The channel axis and the rank of `x`.
    axis: usize,
    rank: usize,
}

/// The float32 constant `e` is, directly or through bound vars.
fn const_of<'f>(view: &FunctionView<'f>, f: &'f Function, e: ExprId) -> Option<&'f Constant> {
    let e = view.unwrap(e, usize::MAX);
    match &f.exprs.get(e)?.kind {
        ExprKind::Const(c) if c.dtype == DType::F32 => Some(c),
        _ => None,
    }
}

/// The values of a 1-d float32 constant of `n` elements.
fn values(c: &Constant, n: usize) -> Option<Vec<f64>> {
    if c.shape.len() != 1 || c.numel() != n {
        return None;
    }
    (0..n).map(|i| c.get_f64(i)).collect()
}

fn f32_constant(shape: Vec<i64>, v: impl Iterator<Item = f64>) -> Option<Constant> {
    let bytes: Vec<u8> = v.flat_map(|x| (x as f32).to_le_bytes()).collect();
    Constant::from_bytes(DType::F32, shape, bytes).ok()
}

fn find(f: &Function) -> Vec<Site> {
    let view = FunctionView::new(f);
    let mut sites = Vec::new();
    for b in f.bindings() {
        let ExprKind::Call {
            callee: Callee::Op(Op::BatchNorm(a)),
            args,
        } = &f.expr(b.value).kind
        else {
            continue;
        };
        if a.training || args.len() != 5 || view.returned().contains(&b.var) {
            continue;
        }
        // Every use is `bn[0]`.
        let only_first = view.users_of(b.var).iter().all(|&u| {
            view.bound(u).is_some_and(|(_, v)| {
                matches!(&f.expr(v).kind, ExprKind::TupleGetItem(t, 0)
                    if f.as_var(*t) == Some(b.var))
            })
        });
        if !only_first {
            continue;
        }
        let x = args[0];
        let Some(tt) = f.expr(x).ty.as_tensor() else {
            continue;
        };
        let (Some(dims), Some(DType::F32)) = (&tt.dims, tt.dtype) else {
            continue;
        };
        let rank = dims.len();
        let axis = if a.axis < 0 {
            a.axis + rank as i64
        } else {
            a.axis
        };
        let Ok(axis) = usize::try_from(axis) else {
            continue;
        };
        let Some(c) = dims.get(axis).and_then(|d| d.as_static()) else {
            continue;
        };
        let Ok(c) = usize::try_from(c) else { continue };
        let stats: Option<Vec<Vec<f64>>> = args[1..]
            .iter()
            .map(|&e| const_of(&view, f, e).and_then(|k| values(k, c)))
            .collect();
        let Some(stats) = stats else { continue };
        let eps = a.epsilon.0;
        let gamma = if a.scale {
            stats[0].clone()
        } else {
            vec![1.0; c]
        };
        let beta = if a.center {
            stats[1].clone()
        } else {
            vec![0.0; c]
        };
        let scale: Vec<f64> = (0..c)
            .map(|i| gamma[i] / (stats[3][i] + eps).sqrt())
            .collect();
        let shift: Vec<f64> = (0..c).map(|i| beta[i] - stats[2][i] * scale[i]).collect();
        if scale.iter().chain(&shift).any(|v| !v.is_finite()) {
            continue;
        }
        let conv = conv_to_fold(f, &view, x, b.var, axis, c);
        sites.push(Site {
            bn: b.var,
            x,
            conv,
            scale,
            shift,
            axis,
            rank,
        });
    }
    sites
}

/// Where the scale goes in a folded weight: the output channel is the weight's first axis
/// (conv2d's `OIHW`) or its last (matmul's `[K, N]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ChannelAxis {
    First,
    Last,
}

/// The conv2d or matmul whose weights can take the scale: `x` is a var bound to an NCHW/OIHW
/// conv2d (channel axis 1) or to a matmul with a 2-d weight `[K, c]` (channel axis last), the
/// weight a float32 constant of `c` output channels, and `x` used only by `bn`.
fn conv_to_fold(
    f: &Function,
    view: &FunctionView<'_>,
    x: ExprId,
    bn: VarId,
    axis: usize,
    c: usize,
) -> Option<(VarId, ExprId, ExprId, Constant, ChannelAxis)> {
    let xv = f.as_var(x)?;
    let (_, value) = view.bound(xv)?;
    let ExprKind::Call {
        callee: Callee::Op(op),
        args,
    } = &f.expr(value).kind
    else {
        return None;
    };
    let rank = f.expr(x).ty.as_tensor()?.rank()?;
    let (want_axis, w_rank, channel) = match op {
        Op::Conv2d(ca)
            if ca.data_layout == "NCHW"
                && ca.kernel_layout == "OIHW"
                && ca.out_layout == "NCHW"
                && ca.out_dtype.is_none_or(|d| d == DType::F32) =>
        {
            (1, 4, ChannelAxis::First)
        }
        Op::Matmul { out_dtype } if out_dtype.is_none_or(|d| d == DType::F32) && rank >= 1 => {
            (rank - 1, 2, ChannelAxis::Last)
        }
        _ => return None,
    };
    if axis != want_axis || args.len() != 2 || view.returned().contains(&xv) {
        return None;
    }
    if view.users_of(xv) != [bn] {
        return None;
    }
    let w = const_of(view, f, args[1])?;
    let out_channels = match channel {
        ChannelAxis::First => w.shape.first(),
        ChannelAxis::Last => w.shape.last(),
    };
    if w.shape.len() != w_rank || usize::try_from(*out_channels?).ok()? != c {
        return None;
    }
    Some((xv, value, args[0], w.clone(), channel))
}

fn fold_in(f: &mut Function) {
    let sites = find(f);
    for s in sites {
        let c = s.scale.len();
        let mut bshape = vec![1i64; s.rank];
        bshape[s.axis] = c as i64;
        let Some(shift) = f32_constant(bshape.clone(), s.shift.iter().copied()) else {
            continue;
        };
        let x_ty = f.expr(s.x).ty.clone();
        // What `bn[0]` becomes the shift added to.
        let base = match &s.conv {
            Some((xv, value, data, w, channel)) => {
                let per = (w.numel() / c.max(1)).max(1);
                let ch = |i: usize| match channel {
                    ChannelAxis::First => i / per,
                    ChannelAxis::Last => i % c.max(1),
                };
                let folded = (0..w.numel()).map(|i| w.get_f64(i).unwrap_or(0.0) * s.scale[ch(i)]);
                let Some(nw) = f32_constant(w.shape.clone(), folded) else {
                    continue;
                };
                let ExprKind::Call { callee, .. } = f.expr(*value).kind.clone() else {
                    continue;
                };
                let w_ty = nw.ty();
                let we = f.add_expr(ExprKind::Const(nw), w_ty);
                let conv = f.add_expr(
                    ExprKind::Call {
                        callee,
                        args: vec![*data, we],
                    },
                    x_ty.clone(),
                );
                set_value(f, *xv, conv);
                remove_binding(f, s.bn);
                s.x
            }
            None => {
                let Some(scale) = f32_constant(bshape, s.scale.iter().copied()) else {
                    continue;
                };
                let s_ty = scale.ty();
                let se = f.add_expr(ExprKind::Const(scale), s_ty);
                let mul = f.add_expr(
                    ExprKind::Call {
                        callee: Callee::Op(Op::Multiply),
                        args: vec![s.x, se],
                    },
                    x_ty.clone(),
                );
                // The batch_norm's var now holds the scaled tensor.
                let bn_var = &mut f.vars[s.bn];
                bn_var.ty = x_ty.clone();
                let bn_expr = bn_var.expr;
                f.exprs[bn_expr].ty = x_ty.clone();
                set_value(f, s.bn, mul);
                bn_expr
            }
        };
        let t_ty = shift.ty();
        let te = f.add_expr(ExprKind::Const(shift), t_ty);
        let users: Vec<VarId> = f
            .bindings()
            .filter(|b| {
                matches!(&f.expr(b.value).kind, ExprKind::TupleGetItem(t, 0)
                    if f.as_var(*t) == Some(s.bn))
            })
            .map(|b| b.var)
            .collect();
        for u in users {
            let ty: Type = f.var(u).ty.clone();
            let add = f.add_expr(
                ExprKind::Call {
                    callee: Callee::Op(Op::Add),
                    args: vec![base, te],
                },
                ty,
            );
            set_value(f, u, add);
        }
    }
    f.blocks.retain(|b| !b.bindings.is_empty());
}

fn set_value(f: &mut Function, var: VarId, value: ExprId) {
    for b in f.blocks.iter_mut().flat_map(|b| b.bindings.iter_mut()) {
        if b.var == var {
            *b = Binding { var, value };
        }
    }
}

fn remove_binding(f: &mut Function, var: VarId) {
    for b in f.blocks.iter_mut() {
        b.bindings.retain(|x| x.var != var);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::{parse_module_str, print_module};
    use crate::transform::bind_params;

    fn ops(f: &Function) -> Vec<&str> {
        f.bindings()
            .filter_map(|b| match &f.expr(b.value).kind {
                ExprKind::Call {
                    callee: Callee::Op(op),
                    ..
                } => Some(op.name()),
                _ => None,
            })
            .collect()
    }

    /// `main(x, w, g, b, m, v)`: conv2d → batch_norm → relu, and a second batch_norm on the
    /// input itself (no conv to fold into); `w, g, b, m, v` bound to constants.
    pub(crate) fn conv_bn_relu() -> Module {
        let t = |s: &str| format!("R.Tensor(({s}), dtype=\"float32\")");
        let src = format!(
            "@I.ir_module\nclass Module:\n    @R.function\n    def main(x: {x}, w: {w}, g: {c}, b: {c}, m: {c}, v: {c}) -> R.Tuple({x}, {x}):\n        with R.dataflow():\n            y = R.nn.conv2d(x, w, padding=[1, 1, 1, 1])\n            bn = R.nn.batch_norm(y, g, b, m, v, axis=1, epsilon=1e-05, training=False)\n            z = bn[0]\n            r = R.nn.relu(z)\n            bn2 = R.nn.batch_norm(x, g, b, m, v, axis=1, epsilon=1e-05, training=False)\n            q = bn2[0]\n            R.output(r, q)\n        return (r, q)\n",
            x = t("1, 2, 4, 4"),
            w = t("2, 2, 3, 3"),
            c = t("2,"),
        );
        let m = parse_module_str(&src).unwrap_or_else(|e| unreachable!("{e}"));
        let k = |shape: Vec<i64>, v: &[f32]| {
            let n: usize = shape.iter().product::<i64>() as usize;
            let bytes: Vec<u8> = (0..n).flat_map(|i| v[i % v.len()].to_le_bytes()).collect();
            Constant::from_bytes(DType::F32, shape, bytes).unwrap_or_else(|e| unreachable!("{e}"))
        };
        let params = vec![
            (
                "w".to_string(),
                k(vec![2, 2, 3, 3], &[0.5, -0.25, 0.125, 1.0, -1.5]),
            ),
            ("g".to_string(), k(vec![2], &[1.5, -0.5])),
            ("b".to_string(), k(vec![2], &[0.25, 2.0])),
            ("m".to_string(), k(vec![2], &[0.1, -0.3])),
            ("v".to_string(), k(vec![2], &[0.8, 2.5])),
        ];
        bind_params(&m, "main", &params).unwrap_or_else(|e| unreachable!("{e}"))
    }

    #[test]
    fn batch_norms_become_conv_weights_and_affine_maps() {
        let m = conv_bn_relu();
        let before = ops(m.get("main").unwrap_or_else(|| unreachable!()));
        assert_eq!(
            before,
            vec![
                "relax.nn.conv2d",
                "relax.nn.batch_norm",
                "relax.nn.relu",
                "relax.nn.batch_norm"
            ]
        );
        let out = fold_batch_norm(&m).unwrap_or_else(|e| unreachable!("{e}"));
        crate::ir::verify::verify(&out).unwrap_or_else(|e| unreachable!("{e}"));
        let after = ops(out.get("main").unwrap_or_else(|| unreachable!()));
        let text = print_module(&out).text;
        assert_eq!(
            after,
            vec![
                "relax.nn.conv2d",
                "relax.add",
                "relax.nn.relu",
                "relax.multiply",
                "relax.add"
            ],
            "{text}"
        );
        // The folded weight: w[o] * g[o] / sqrt(v[o] + eps), here for o = 1, element 0 of it.
        let f = out.get("main").unwrap_or_else(|| unreachable!());
        let conv = f.bindings().next().unwrap_or_else(|| unreachable!());
        let ExprKind::Call { args, .. } = &f.expr(conv.value).kind else {
            unreachable!()
        };
        let ExprKind::Const(w) = &f.expr(args[1]).kind else {
            unreachable!("{text}")
        };
        // Element 18 is w[1, 0, 0, 0] = 0.5 * ... pattern value index 18 % 5 = 3 -> 1.0.
        let want = 1.0 * (-0.5) / (2.5f64 + 1e-5).sqrt();
        let got = w.get_f64(18).unwrap_or(f64::NAN);
        assert!((got - want).abs() < 1e-6, "{got} vs {want}");
        // Running it again changes nothing.
        let again = fold_batch_norm(&out).unwrap_or_else(|e| unreachable!("{e}"));
        assert_eq!(print_module(&again).text, text);
    }

    #[test]
    fn training_mode_and_non_constant_statistics_are_left_alone() {
        // Training mode (TVM's default) with constant statistics.
        let m = conv_bn_relu();
        let train = print_module(&m)
            .text
            .replace("training=False", "training=True");
        let consts = {
            let mut t = crate::text::ConstTable::new();
            for (i, c) in print_module(&m).constants.into_iter().enumerate() {
                t.insert("relax.expr.Constant", i, c);
            }
            t
        };
        let m = crate::text::parse_module(&train, "t.relax", &consts)
            .unwrap_or_else(|e| unreachable!("{e}"));
        let out = fold_batch_norm(&m).unwrap_or_else(|e| unreachable!("{e}"));
        assert_eq!(print_module(&out).text, print_module(&m).text);
        // Statistics that are parameters, not constants.
        let t = |s: &str| format!("R.Tensor(({s}), dtype=\"float32\")");
        let src = format!(
            "@I.ir_module\nclass Module:\n    @R.function\n    def main(x: {x}, g: {c}, b: {c}, m: {c}, v: {c}) -> {x}:\n        with R.dataflow():\n            bn = R.nn.batch_norm(x, g, b, m, v, axis=1, training=False)\n            z = bn[0]\n            R.output(z)\n        return z\n",
            x = t("1, 2, 4, 4"),
            c = t("2,"),
        );
        let m = parse_module_str(&src).unwrap_or_else(|e| unreachable!("{e}"));
        let out = fold_batch_norm(&m).unwrap_or_else(|e| unreachable!("{e}"));
        assert_eq!(print_module(&out).text, print_module(&m).text);
    }
}
