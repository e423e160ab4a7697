//! The CUTLASS pattern table for attention, matmul and conv2d: TVM's
//! `relax/backend/cuda/cutlass.py` entries in the order `get_patterns_with_prefix("cutlass")`
//! returns them, with `_check_matmul`, `_check_conv2d` and `_check_residual` and a reason for
//! every rejection.
//!
//! Contract:
//!
//! - [`table`] returns 50 entries, most specific first (decreasing priorities, so the
//!   pipeline's stable sort keeps TVM's order): `cutlass.attention_bias` and
//!   `cutlass.attention` (`make_attention_pattern`: the op with wildcard `query`, `key`,
//!   `value` and `bias` captures, no check function, as in TVM — what the fused kernel cannot
//!   run, the backend's claim declines with the reason); then the residual blocks,
//!   relu-activated first — for
//!   each base `matmul_transposed_bias_gelu`, `matmul_transposed_bias_relu`,
//!   `matmul_transposed_bias`, `matmul_bias_gelu`, `matmul_bias_relu`, `matmul_bias`,
//!   `conv2d_bias_silu`, `conv2d_bias_relu`, `conv2d_bias` the suffixes
//!   `_residual_multiply_relu`, `_residual_add_relu`; then the same bases with
//!   `_residual_multiply`, `_residual_add` — then `matmul_transposed_bias_gelu` …
//!   `matmul`, then `conv2d_bias_silu`, `conv2d_bias_relu`, `conv2d_bias`, `conv2d`. TVM's
//!   `stacked_attention` / `attention_var_len`, norm and `decode_matmul` entries are not this
//!   backend's (no kernels here for them, and fusebox has no `attention_var_len` op or
//!   `decode` call_tir producers).
//! - Matmul entries carry [`CutlassCheck`] `cutlass_matmul`, TVM's order: (1) no leaking
//!   intermediate (the stock check); (2) dtypes float16/float16, float32/float32 or any
//!   int8/uint8 pair (bfloat16 only with the backend option `bf16 = true`: TVM's table has no
//!   bfloat16); (3) the residual rule; (4) a static reduction dim, and batch dims that are 1
//!   on one side or provably equal after right-alignment.
//! - Conv2d entries carry `cutlass_conv2d`: (1) leak; (2) `data_layout = "NHWC"` and
//!   `kernel_layout = "OHWI"`; (3) dtypes; (4) the residual rule; (5) a static data shape;
//!   (6) not depthwise (`IC == OC == groups`).
//! - The residual rule (`_check_residual`): the residual is a bound var or a parameter (not a
//!   constant), does not depend on the root's output, and has the root's output shape or is
//!   bias-like (`shape[-1] == OC == prod(shape)`).
//!
//! ```text
//! lv = R.matmul(x, w)        # x: (32, 64) float16, w: (64, 128) float16
//! lv1 = R.add(lv, b)         # b: (128,)
//! lv2 = R.add(lv1, r)        # r: (32, 128)
//! y = R.nn.relu(lv2)         # -> cutlass.matmul_bias_residual_add_relu
//! ```

use fusebox_core::ir::{Callee, DType, Dim, ExprKind, Type, VarId};
use fusebox_core::op::Op;
use fusebox_core::pattern::check::{Check, CheckContext, NoLeakingIntermediates, Verdict};
use fusebox_core::pattern::helpers::{fused_bias_activation, matmul, residual_block};
use fusebox_core::pattern::{Pattern, PatternBuilder};
use fusebox_core::transform::FusionPattern;
use std::collections::{HashSet, VecDeque};
use std::sync::Arc;

/// The matmul bases in TVM's priority order: (name suffix, bias, activation, transposed).
const MATMUL_BASES: [(&str, bool, Option<&str>, bool); 8] = [
    (
        "matmul_transposed_bias_gelu",
        true,
        Some("relax.nn.gelu"),
        true,
    ),
    (
        "matmul_transposed_bias_relu",
        true,
        Some("relax.nn.relu"),
        true,
    ),
    ("matmul_transposed_bias", true, None, true),
    ("matmul_transposed", false, None, true),
    ("matmul_bias_gelu", true, Some("relax.nn.gelu"), false),
    ("matmul_bias_relu", true, Some("relax.nn.relu"), false),
    ("matmul_bias", true, None, false),
    ("matmul", false, None, false),
];

/// The conv2d bases in TVM's priority order: (name suffix, bias, activation).
const CONV_BASES: [(&str, bool, Option<&str>); 4] = [
    ("conv2d_bias_silu", true, Some("relax.nn.silu")),
    ("conv2d_bias_relu", true, Some("relax.nn.relu")),
    ("conv2d_bias", true, None),
    ("conv2d", false, None),
];

/// Which check an entry carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckKind {
    /// `_check_matmul`.
    Matmul,
    /// `_check_conv2d`.
    Conv2d,
}

/// A table entry before its priority: name, pattern, check.
type Entry = (String, Pattern, Option<Arc<dyn Check>>);

/// `make_attention_pattern(with_bias)`: `relax.nn.attention(query, key, value)` or
/// `relax.nn.attention_bias(query, key, value, bias)`, each operand a named wildcard.
pub fn attention_pattern(with_bias: bool) -> Pattern {
    let mut b = PatternBuilder::new();
    let mut args = Vec::new();
    for name in ["query", "key", "value", "bias"]
        .into_iter()
        .take(if with_bias { 4 } else { 3 })
    {
        let w = b.wildcard();
        args.push(b.capture(name, w));
    }
    let op = if with_bias {
        "relax.nn.attention_bias"
    } else {
        "relax.nn.attention"
    };
    let root = b.call(op, args);
    b.finish(root)
}

/// The CUTLASS table (see the module doc). `allow_bf16` extends the dtype rule with
/// bfloat16/bfloat16 (the backend option `bf16`).
pub fn table(allow_bf16: bool) -> Vec<FusionPattern> {
    let mm = Arc::new(CutlassCheck {
        kind: CheckKind::Matmul,
        allow_bf16,
    }) as Arc<dyn Check>;
    let cv = Arc::new(CutlassCheck {
        kind: CheckKind::Conv2d,
        allow_bf16,
    }) as Arc<dyn Check>;
    let mut bases: Vec<(String, Pattern, Arc<dyn Check>)> = Vec::new();
    for (n, bias, act, tr) in MATMUL_BASES {
        bases.push((n.to_string(), matmul(bias, act, tr), mm.clone()));
    }
    for (n, bias, act) in CONV_BASES {
        bases.push((
            n.to_string(),
            fused_bias_activation("relax.nn.conv2d", bias, act),
            cv.clone(),
        ));
    }
    let mut entries: Vec<Entry> = vec![
        (
            "cutlass.attention_bias".into(),
            attention_pattern(true),
            None,
        ),
        ("cutlass.attention".into(), attention_pattern(false), None),
    ];
    for act in [Some("relax.nn.relu"), None] {
        let post = if act.is_some() { "_relu" } else { "" };
        for (name, pat, check) in bases.iter().filter(|(n, ..)| n.contains("bias")) {
            for (op, tag) in [("relax.multiply", "multiply"), ("relax.add", "add")] {
                entries.push((
                    format!("cutlass.{name}_residual_{tag}{post}"),
                    residual_block(pat, op, act),
                    Some(check.clone()),
                ));
            }
        }
    }
    for (name, pat, check) in bases {
        entries.push((format!("cutlass.{name}"), pat, Some(check)));
    }
    let n = entries.len() as i32;
    entries
        .into_iter()
        .enumerate()
        .map(|(i, (name, p, c))| {
            let e = FusionPattern::new(&name, p).with_priority((n - i as i32) * 10);
            match c {
                Some(c) => e.with_check(c),
                None => e,
            }
        })
        .collect()
}

/// TVM's `_check_matmul` / `_check_conv2d` (see the module doc).
#[derive(Clone, Copy, Debug)]
pub struct CutlassCheck {
    /// Which one.
    pub kind: CheckKind,
    /// Whether bfloat16 pairs are accepted (not in TVM).
    pub allow_bf16: bool,
}

impl Check for CutlassCheck {
    fn name(&self) -> &str {
        match self.kind {
            CheckKind::Matmul => "cutlass_matmul",
            CheckKind::Conv2d => "cutlass_conv2d",
        }
    }

    fn check(&self, cx: &CheckContext<'_, '_>) -> Verdict {
        if let Verdict::Reject { reason } = NoLeakingIntermediates.check(cx) {
            return Verdict::Reject { reason };
        }
        let r = match self.kind {
            CheckKind::Matmul => self.check_matmul(cx),
            CheckKind::Conv2d => self.check_conv2d(cx),
        };
        match r {
            Ok(()) => Verdict::Accept,
            Err(reason) => Verdict::Reject { reason },
        }
    }
}

fn tensor_dims<'t>(t: Option<&'t Type>, what: &str) -> Result<(DType, &'t [Dim]), String> {
    let t = t
        .and_then(Type::as_tensor)
        .ok_or_else(|| format!("{what} is not a tensor"))?;
    let d = t
        .dtype
        .ok_or_else(|| format!("{what} has an unknown dtype"))?;
    let dims = t
        .dims
        .as_deref()
        .ok_or_else(|| format!("{what} has an unknown shape"))?;
    Ok((d, dims))
}

impl CutlassCheck {
    /// TVM's `_is_supported_dtype`, plus bfloat16 when allowed.
    fn dtype_rule(&self, l: DType, r: DType) -> Result<(), String> {
        let int8 = |d: DType| matches!(d, DType::I8 | DType::U8);
        let ok = (l == DType::F16 && r == DType::F16)
            || (l == DType::F32 && r == DType::F32)
            || (int8(l) && int8(r))
            || (self.allow_bf16 && l == DType::BF16 && r == DType::BF16);
        if ok {
            Ok(())
        } else {
            Err(format!(
                "unsupported dtypes ({l}, {r}): CUTLASS takes float16/float16, float32/float32 \
                 or an int8/uint8 pair{}",
                if self.allow_bf16 {
                    " or bfloat16/bfloat16"
                } else {
                    " (bfloat16 needs the backend option bf16 = true)"
                }
            ))
        }
    }

    fn check_matmul(&self, cx: &CheckContext<'_, '_>) -> Result<(), String> {
        let ty = |n: &str| cx.capture(n).and_then(|e| cx.ty(e));
        let (ld, ls) = tensor_dims(ty("lhs"), "lhs")?;
        let (rd, rs) = tensor_dims(ty("rhs"), "rhs")?;
        self.dtype_rule(ld, rd)?;
        check_residual(cx)?;
        matmul_shape_rule(ls, rs)
    }

    fn check_conv2d(&self, cx: &CheckContext<'_, '_>) -> Result<(), String> {
        let root = cx.capture("root").ok_or("no conv2d root")?;
        let ExprKind::Call {
            callee: Callee::Op(Op::Conv2d(attrs)),
            args,
        } = &cx.func().expr(root).kind
        else {
            return Err("the root is not a conv2d call".into());
        };
        if attrs.data_layout != "NHWC" || attrs.kernel_layout != "OHWI" {
            return Err(format!(
                "layouts {}/{}: CUTLASS conv2d needs data_layout NHWC and kernel_layout OHWI",
                attrs.data_layout, attrs.kernel_layout
            ));
        }
        let (Some(&x), Some(&w)) = (args.first(), args.get(1)) else {
            return Err("conv2d takes two arguments".into());
        };
        let (xd, xs) = tensor_dims(cx.ty(x), "data")?;
        let (wd, ws) = tensor_dims(cx.ty(w), "weight")?;
        self.dtype_rule(xd, wd)?;
        check_residual(cx)?;
        if xs.iter().any(|d| d.as_static().is_none()) {
            return Err(format!("the data shape {} is not static", shape_str(xs)));
        }
        let ic = xs.get(3).and_then(Dim::as_static);
        let oc = ws.first().and_then(Dim::as_static);
        if ic.is_some() && ic == oc && oc == Some(attrs.groups) {
            return Err(format!(
                "depthwise conv2d (IC = OC = groups = {}) is not supported",
                attrs.groups
            ));
        }
        Ok(())
    }
}

/// `is_shape_valid_for_cutlass_matmul`.
pub fn matmul_shape_rule(ls: &[Dim], rs: &[Dim]) -> Result<(), String> {
    let k = ls.last().ok_or("lhs has rank 0")?;
    if k.as_static().is_none() {
        return Err(format!(
            "the reduction dim (lhs.shape[-1] = {k}) is not a static integer"
        ));
    }
    let lb = ls.get(..ls.len().saturating_sub(2)).unwrap_or(&[]);
    let rb = rs.get(..rs.len().saturating_sub(2)).unwrap_or(&[]);
    let is_one = |b: &[Dim]| {
        b.iter().try_fold(1i64, |acc, d| {
            d.as_static().and_then(|v| acc.checked_mul(v))
        }) == Some(1)
    };
    if is_one(lb) || is_one(rb) {
        return Ok(());
    }
    let n = lb.len().max(rb.len());
    let pad = |b: &[Dim]| -> Vec<Dim> {
        let mut v = vec![Dim::Static(1); n - b.len()];
        v.extend(b.iter().cloned());
        v
    };
    let (pl, pr) = (pad(lb), pad(rb));
    for (l, r) in pl.iter().zip(&pr) {
        if l != r {
            return Err(format!(
                "batch dims {} and {} are neither equal nor 1 on one side (CUTLASS does not \
                 broadcast partially)",
                shape_str(lb),
                shape_str(rb)
            ));
        }
    }
    Ok(())
}

/// `_check_residual`.
fn check_residual(cx: &CheckContext<'_, '_>) -> Result<(), String> {
    let Some(res) = cx.capture("residual") else {
        return Ok(());
    };
    let f = cx.func();
    let rvar = match &f.expr(res).kind {
        ExprKind::Var(v) => *v,
        _ => cx
            .bound_var(res)
            .ok_or("the residual is not bound to a var (a constant residual is not supported)")?,
    };
    let root = cx.capture("root").ok_or("no root")?;
    let root_var = cx.bound_var(root).ok_or("the root is not bound")?;
    // BFS over the users of the root: the residual must not depend on it.
    let mut seen: HashSet<VarId> = HashSet::new();
    let mut queue = VecDeque::from([root_var]);
    while let Some(v) = queue.pop_front() {
        if v == rvar {
            return Err(format!(
                "the residual `{}` depends on the root's output",
                f.var(rvar).name
            ));
        }
        if seen.insert(v) {
            queue.extend(cx.users(v).iter().copied());
        }
    }
    let static_shape = |t: &Type, what: &str| -> Result<Vec<i64>, String> {
        let dims = t
            .as_tensor()
            .and_then(|t| t.dims.as_deref())
            .ok_or_else(|| format!("the {what} has an unknown shape"))?;
        dims.iter()
            .map(|d| {
                d.as_static()
                    .ok_or_else(|| format!("the {what} shape {} is not static", shape_str(dims)))
            })
            .collect()
    };
    let s1 = static_shape(&f.var(root_var).ty, "root output")?;
    let s2 = static_shape(&f.var(rvar).ty, "residual")?;
    let oc = s1.last().copied().unwrap_or(1);
    let bias_like = s2.last() == Some(&oc) && s2.iter().product::<i64>() == oc;
    if s1 != s2 && !bias_like {
        return Err(format!(
            "the residual shape {:?} is neither the output shape {:?} nor bias-like",
            s2, s1
        ));
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_tvms_order() {
        let t = table(false);
        assert_eq!(t.len(), 50);
        // TVM's attention entries come before every matmul / conv2d one, without checks.
        assert_eq!(t[0].name, "cutlass.attention_bias");
        assert_eq!(t[1].name, "cutlass.attention");
        assert!(t[0].check.is_none() && t[1].check.is_none());
        let names: Vec<&str> = t[2..].iter().map(|p| p.name.as_str()).collect();
        assert_eq!(
            names[0],
            "cutlass.matmul_transposed_bias_gelu_residual_multiply_relu"
        );
        assert_eq!(
            names[1],
            "cutlass.matmul_transposed_bias_gelu_residual_add_relu"
        );
        assert_eq!(names[17], "cutlass.conv2d_bias_residual_add_relu");
        assert_eq!(
            names[18],
            "cutlass.matmul_transposed_bias_gelu_residual_multiply"
        );
        assert_eq!(names[35], "cutlass.conv2d_bias_residual_add");
        assert_eq!(names[36], "cutlass.matmul_transposed_bias_gelu");
        assert_eq!(names[43], "cutlass.matmul");
        assert_eq!(
            &names[44..],
            [
                "cutlass.conv2d_bias_silu",
                "cutlass.conv2d_bias_relu",
                "cutlass.conv2d_bias",
                "cutlass.conv2d"
            ]
        );
        assert!(t.windows(2).all(|w| w[0].priority > w[1].priority));
        assert!(fusebox_core::pattern_table::lint(&t).is_empty());
    }

    #[test]
    fn matmul_shape_rule_as_tvm() {
        let s = |v: &[i64]| v.iter().map(|&x| Dim::Static(x)).collect::<Vec<_>>();
        assert!(matmul_shape_rule(&s(&[4, 8]), &s(&[8, 4])).is_ok());
        assert!(matmul_shape_rule(&s(&[2, 4, 8]), &s(&[8, 4])).is_ok());
        assert!(matmul_shape_rule(&s(&[4, 8]), &s(&[3, 8, 4])).is_ok());
        assert!(matmul_shape_rule(&s(&[3, 4, 8]), &s(&[3, 8, 4])).is_ok());
        assert!(matmul_shape_rule(&s(&[2, 3, 4, 8]), &s(&[3, 8, 4])).is_err());
        assert!(matmul_shape_rule(&s(&[3, 1, 4, 8]), &s(&[3, 2, 8, 4])).is_err());
        let k = vec![Dim::Static(4), Dim::sym("k")];
        assert!(matmul_shape_rule(&k, &s(&[8, 4])).is_err_and(|e| e.contains("lhs.shape[-1] = k")));
        let b = Dim::sym("b");
        let l = vec![b.clone(), Dim::Static(4), Dim::Static(8)];
        assert!(matmul_shape_rule(&l, &l).is_ok());
    }
}
