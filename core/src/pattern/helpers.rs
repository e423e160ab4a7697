//! Pattern helpers with the shapes of TVM's `relax/backend/patterns.py`. Each names its
//! annotations as captures (`lhs`, `rhs`, `root`, `bias`, `residual`, …) so checks can read them.
//!
//! ```text
//! fused_bias_activation("relax.nn.conv2d", true, Some("relax.nn.relu"))
//!   = relax.nn.relu(relax.add(root @ relax.nn.conv2d(lhs @ _, rhs @ _), bias @ _))
//! ```

use super::ast::{PatId, Pattern, PatternBuilder};

/// `act(add(op(lhs, rhs), bias))` with the add and the activation optional
/// (`make_fused_bias_activation_pattern`).
pub fn fused_bias_activation(op: &str, with_bias: bool, activation: Option<&str>) -> Pattern {
    let mut b = PatternBuilder::new();
    let root = bias_activation_body(&mut b, op, None, with_bias, activation);
    b.finish(root)
}

fn bias_activation_body(
    b: &mut PatternBuilder,
    op: &str,
    rhs_override: Option<PatId>,
    with_bias: bool,
    activation: Option<&str>,
) -> PatId {
    let lhs_w = b.wildcard();
    let lhs = b.capture("lhs", lhs_w);
    let rhs = match rhs_override {
        Some(r) => r,
        None => {
            let w = b.wildcard();
            b.capture("rhs", w)
        }
    };
    let call = b.call(op, vec![lhs, rhs]);
    let mut out = b.capture("root", call);
    if with_bias {
        let bw = b.wildcard();
        let bias = b.capture("bias", bw);
        out = b.call("relax.add", vec![out, bias]);
    }
    if let Some(act) = activation {
        out = b.call(act, vec![out]);
    }
    out
}

/// `make_matmul_pattern`: `matmul(lhs, rhs)` or, transposed, `matmul(lhs, permute_dims(rhs))`,
/// then optional bias and activation.
pub fn matmul(with_bias: bool, activation: Option<&str>, transposed_rhs: bool) -> Pattern {
    let mut b = PatternBuilder::new();
    let rhs = if transposed_rhs {
        let w = b.wildcard();
        let r = b.capture("rhs", w);
        Some(b.call("relax.permute_dims", vec![r]))
    } else {
        None
    };
    let root = bias_activation_body(&mut b, "relax.matmul", rhs, with_bias, activation);
    b.finish(root)
}

/// `make_residual_block_pattern`: `binop(base, residual) | binop(residual, base)` with the same
/// base and residual nodes in both alternatives, then an optional activation.
pub fn residual_block(base: &Pattern, binary_op: &str, activation: Option<&str>) -> Pattern {
    let mut b = PatternBuilder::new();
    let node = copy_into(&mut b, base, base.root());
    let rw = b.wildcard();
    let residual = b.capture("residual", rw);
    let left = b.call(binary_op, vec![node, residual]);
    let right = b.call(binary_op, vec![residual, node]);
    let mut out = b.or(left, right);
    if let Some(act) = activation {
        out = b.call(act, vec![out]);
    }
    let mut p = b.finish(out);
    p.constraints = base.constraints.clone();
    p
}

/// `make_layer_norm_pattern`: `layer_norm(_, _, _)`.
pub fn layer_norm() -> Pattern {
    let mut b = PatternBuilder::new();
    let args = vec![b.wildcard(), b.wildcard(), b.wildcard()];
    let root = b.call("relax.nn.layer_norm", args);
    b.finish(root)
}

/// `rms_norm(data, weight)` (TVM matches a `call_tir` of an rms_norm PrimFunc; fusebox has the
/// op itself).
pub fn rms_norm() -> Pattern {
    let mut b = PatternBuilder::new();
    let (x, w) = (b.wildcard(), b.wildcard());
    let x = b.capture("inp", x);
    let w = b.capture("weight", w);
    let root = b.call("relax.nn.rms_norm", vec![x, w]);
    b.finish(root)
}

/// Scaled-dot-product attention as the op graph fusebox sees (there is no fused attention op):
/// `matmul(softmax(matmul(query, permute_dims(key)) [* scale]), value)`.
pub fn attention(with_scale: bool) -> Pattern {
    let mut b = PatternBuilder::new();
    let (q, k, v) = (b.wildcard(), b.wildcard(), b.wildcard());
    let q = b.capture("query", q);
    let k = b.capture("key", k);
    let v = b.capture("value", v);
    let kt = b.call("relax.permute_dims", vec![k]);
    let mut s = b.call("relax.matmul", vec![q, kt]);
    if with_scale {
        let c = b.wildcard();
        let scale = b.capture("scale", c);
        s = b.call("relax.multiply", vec![s, scale]);
    }
    let p = b.call("relax.nn.softmax", vec![s]);
    let out = b.call("relax.matmul", vec![p, v]);
    let root = b.capture("attention", out);
    b.finish(root)
}

/// Copies the subtree of `src` at `id` into `b`, keeping shared nodes shared.
fn copy_into(b: &mut PatternBuilder, src: &Pattern, id: PatId) -> PatId {
    let mut map = std::collections::HashMap::new();
    copy_rec(b, src, id, &mut map)
}

fn copy_rec(
    b: &mut PatternBuilder,
    src: &Pattern,
    id: PatId,
    map: &mut std::collections::HashMap<PatId, PatId>,
) -> PatId {
    use super::ast::PatNode as N;
    if let Some(&n) = map.get(&id) {
        return n;
    }
    let mut c = |x: PatId, b: &mut PatternBuilder| copy_rec(b, src, x, map);
    let node = match src.node(id).clone() {
        N::Call {
            op,
            args,
            at_least,
            attrs,
        } => {
            let args = args.into_iter().map(|a| c(a, b)).collect();
            N::Call {
                op,
                args,
                at_least,
                attrs,
            }
        }
        N::Tuple(fs) => N::Tuple(fs.into_iter().map(|a| c(a, b)).collect()),
        N::TupleGetItem(t, i) => N::TupleGetItem(c(t, b), i),
        N::Or(x, y) => {
            let x = c(x, b);
            N::Or(x, c(y, b))
        }
        N::And(x, y) => {
            let x = c(x, b);
            N::And(x, c(y, b))
        }
        N::Not(x) => N::Not(c(x, b)),
        N::DType(x, d) => N::DType(c(x, b), d),
        N::Shape(x, s) => N::Shape(c(x, b), s),
        N::Capture(n, x) => N::Capture(n, c(x, b)),
        leaf @ (N::Wildcard | N::Const | N::Var(_)) => leaf,
    };
    let new = b.add(node);
    map.insert(id, new);
    new
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_match_tvm() {
        assert_eq!(
            fused_bias_activation("relax.nn.conv2d", true, Some("relax.nn.relu")).to_string(),
            "relax.nn.relu(relax.add(root @ relax.nn.conv2d(lhs @ _, rhs @ _), bias @ _))"
        );
        assert_eq!(
            fused_bias_activation("relax.nn.conv2d", false, None).to_string(),
            "root @ relax.nn.conv2d(lhs @ _, rhs @ _)"
        );
        assert_eq!(
            matmul(true, Some("relax.nn.gelu"), true).to_string(),
            "relax.nn.gelu(relax.add(root @ relax.matmul(lhs @ _, relax.permute_dims(rhs @ _)), bias @ _))"
        );
        let base = fused_bias_activation("relax.matmul", true, None);
        assert_eq!(
            residual_block(&base, "relax.add", Some("relax.nn.relu")).to_string(),
            "relax.nn.relu(relax.add(relax.add(root @ relax.matmul(lhs @ _, rhs @ _), bias @ _), residual @ _) | relax.add(residual @ _, relax.add(root @ relax.matmul(lhs @ _, rhs @ _), bias @ _)))"
        );
        assert_eq!(layer_norm().to_string(), "relax.nn.layer_norm(_, _, _)");
    }
}
