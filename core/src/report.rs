//! The partition report: what went where, as JSON (the source of truth), a DOT graph, or a
//! self-contained HTML page ([`html`]).
//!
//! ```text
//! {"functions": [{"name": "fused_relax_nn_conv2d_relax_nn_relu_dnnl", "codegen": "dnnl",
//!                 "composite": null, "inner_composites": ["dnnl.conv2d_relu"],
//!                 "ops": ["relax.nn.conv2d", "relax.nn.relu"], "params": 2, "outputs": 1,
//!                 "bound_constants": 0, "calls": 1, "backend": null,
//!                 "fusion_kind": null, "anchor": null}],
//!  "main": ["composite:dnnl.conv2d_relu"],
//!  "rejections": []}
//! ```
//!
//! `functions` lists every function other than `main` in first-call order (functions nobody
//! calls follow in module order); `ops` are the op names inside in binding order, with
//! `tuple_get_item[i]` and `tuple` entries; `main` lists main's bindings as
//! `composite:<name>`, `region:<codegen>[<c1>+<c2>…]`, `primitive:<name>`, `call:<name>`,
//! `op:<op name>`, `tuple_get_item[i]`, `tuple` or `var`. `fusion_kind` and `anchor` are set for
//! the primitive functions FuseOps makes (from their `fusion_kind` / `anchor` attributes).

pub mod html;
mod layout;

use crate::ir::{Callee, ExprKind, Function, Module, Type};
use crate::transform::Rejection;
use serde::Serialize;

/// One function of the report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FunctionReport {
    /// The function's name.
    pub name: String,
    /// Its `Codegen` attribute.
    pub codegen: Option<String>,
    /// Its `Composite` attribute.
    pub composite: Option<String>,
    /// The `Composite` attributes of the local functions inside, in binding order.
    pub inner_composites: Vec<String>,
    /// The ops inside, in binding order (local functions included).
    pub ops: Vec<String>,
    /// Number of parameters.
    pub params: usize,
    /// Number of outputs (fields of a returned tuple literal, else 1).
    pub outputs: usize,
    /// Number of non-scalar constants inside.
    pub bound_constants: usize,
    /// Number of call sites in the module.
    pub calls: usize,
    /// The backend that claimed it (filled by the backend flow).
    pub backend: Option<String>,
    /// For a primitive function made by FuseOps: the group's fusion kind (`elemwise`,
    /// `broadcast`, `injective`, `reduction`, `out_elemwise_fusable`, `tuple`, `opaque`).
    pub fusion_kind: Option<String>,
    /// For a primitive function made by FuseOps: the op name of the group's anchor (master).
    pub anchor: Option<String>,
}

/// The whole report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Report {
    /// Every function other than `main`.
    pub functions: Vec<FunctionReport>,
    /// Main's bindings.
    pub main: Vec<String>,
    /// Rejected matches with their reasons.
    pub rejections: Vec<RejectionReport>,
    /// What each backend said about each unit of work (filled by the backend flow; absent from
    /// the JSON when empty).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub claims: Vec<ClaimReport>,
    /// What the report could not establish (absent from the JSON when empty): constants
    /// without values, which deduplication could compare only by identity; and what the
    /// backend flow chose on its own (`conv2d_layout = "auto"`'s layouts and why).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// The claims on one unit of work (a module function main calls).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ClaimReport {
    /// The function.
    pub function: String,
    /// The ops inside, in binding order.
    pub ops: Vec<String>,
    /// The backend that compiled it.
    pub backend: Option<String>,
    /// Whether it fell back to the CPU backend because no backend compiled it.
    pub fallback: bool,
    /// `(backend, reason)` for every backend that declined it, in backend order.
    pub declines: Vec<(String, String)>,
    /// `(backend, error)` for every backend whose compile failed, in backend order.
    pub compile_failures: Vec<(String, String)>,
}

/// A rejected match.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RejectionReport {
    /// The pattern.
    pub pattern: String,
    /// Where (`function/var`).
    pub at: String,
    /// Why.
    pub reason: String,
}

fn collect_ops(f: &Function, ops: &mut Vec<String>, inner: &mut Vec<String>) {
    // The bindings inside the branches of an `if` come before the `if` itself ("if").
    let mut all = Vec::new();
    crate::ir::for_each_binding_deep(f, &f.blocks, &mut |b| all.push(*b));
    for b in &all {
        match &f.expr(b.value).kind {
            ExprKind::If(_) => ops.push("if".into()),
            ExprKind::Call {
                callee: Callee::Op(op),
                ..
            } => ops.push(op.name().to_string()),
            ExprKind::Call {
                callee: Callee::Global(g),
                ..
            } => ops.push(format!("call:{g}")),
            ExprKind::Call {
                callee: Callee::Local(_),
                ..
            } => {}
            ExprKind::TupleGetItem(_, i) => ops.push(format!("tuple_get_item[{i}]")),
            ExprKind::Tuple(_) => ops.push("tuple".into()),
            ExprKind::Function(inner_f) => {
                if let Some(c) = &inner_f.attrs.composite {
                    inner.push(c.clone());
                }
                collect_ops(inner_f, ops, &mut Vec::new());
            }
            _ => {}
        }
    }
}

/// A string attribute that FuseOps sets on the primitive functions it makes.
fn fuse_attr(f: &Function, key: &str) -> Option<String> {
    if !f.attrs.is_primitive() || f.attrs.composite.is_some() {
        return None;
    }
    match f.attrs.extra.get(key) {
        Some(crate::ir::AttrValue::Str(s)) => Some(s.clone()),
        _ => None,
    }
}

fn count_constants(f: &Function) -> usize {
    f.exprs
        .iter()
        .map(|(_, d)| match &d.kind {
            ExprKind::Const(c) if !c.shape.is_empty() => 1,
            ExprKind::ConstRef(_) => 1,
            ExprKind::Function(inner) => count_constants(inner),
            _ => 0,
        })
        .sum()
}

/// How main's binding calling `callee` is described.
fn describe_call(m: &Module, callee: &str) -> String {
    let Some(f) = m.get(callee) else {
        return format!("call:{callee}");
    };
    if let Some(c) = &f.attrs.composite {
        return format!("composite:{c}");
    }
    if let Some(cg) = &f.attrs.codegen {
        let (mut ops, mut inner) = (Vec::new(), Vec::new());
        collect_ops(f, &mut ops, &mut inner);
        return if inner.len() == 1 {
            format!("composite:{}", inner[0])
        } else {
            format!("region:{cg}[{}]", inner.join("+"))
        };
    }
    if f.attrs.is_primitive() {
        return format!("primitive:{callee}");
    }
    format!("call:{callee}")
}

/// Builds the report for a partitioned module.
pub fn build(m: &Module, rejections: &[Rejection]) -> Report {
    let mut order: Vec<String> = Vec::new();
    let mut calls: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    let mut main_entries = Vec::new();
    let mut visit = |f: &Function, order: &mut Vec<String>| {
        for (_, d) in f.exprs.iter() {
            if let ExprKind::Call {
                callee: Callee::Global(g),
                ..
            } = &d.kind
            {
                *calls.entry(g.to_string()).or_default() += 1;
            }
        }
        let mut deep_a = Vec::new();
        crate::ir::for_each_binding_deep(f, &f.blocks, &mut |b| deep_a.push(*b));
        for b in &deep_a {
            if let ExprKind::Call {
                callee: Callee::Global(g),
                ..
            } = &f.expr(b.value).kind
                && !order.iter().any(|o| o == g.as_ref())
            {
                order.push(g.to_string());
            }
        }
    };
    if let Some(main) = m.get("main") {
        visit(main, &mut order);
        let mut deep_b = Vec::new();
        crate::ir::for_each_binding_deep(main, &main.blocks, &mut |b| deep_b.push(*b));
        for b in &deep_b {
            main_entries.push(match &main.expr(b.value).kind {
                ExprKind::Call {
                    callee: Callee::Op(op),
                    ..
                } => format!("op:{}", op.name()),
                ExprKind::Call {
                    callee: Callee::Global(g),
                    ..
                } => describe_call(m, g),
                ExprKind::Call {
                    callee: Callee::Local(_),
                    ..
                } => "call:local".into(),
                ExprKind::TupleGetItem(_, i) => format!("tuple_get_item[{i}]"),
                ExprKind::Tuple(_) => "tuple".into(),
                ExprKind::If(_) => "if".into(),
                _ => "var".into(),
            });
        }
    }
    for (name, f) in &m.functions {
        if name != "main" {
            visit(f, &mut order);
        }
    }
    for name in m.functions.keys() {
        if name != "main" && !order.contains(name) {
            order.push(name.clone());
        }
    }
    let functions = order
        .iter()
        .filter(|n| n.as_str() != "main")
        .filter_map(|n| m.get(n).map(|f| (n, f)))
        .map(|(name, f)| {
            let (mut ops, mut inner) = (Vec::new(), Vec::new());
            collect_ops(f, &mut ops, &mut inner);
            let outputs = match f.ret.map(|r| &f.expr(r).kind) {
                Some(ExprKind::Tuple(xs)) => xs.len(),
                _ => match &f.ret_ty {
                    Type::Tuple(_) | Type::Tensor(_) | Type::Object => 1,
                    _ => 1,
                },
            };
            FunctionReport {
                name: name.clone(),
                codegen: f.attrs.codegen.clone(),
                composite: f.attrs.composite.clone(),
                inner_composites: inner,
                ops,
                params: f.params.len(),
                outputs,
                bound_constants: count_constants(f),
                calls: calls.get(name.as_str()).copied().unwrap_or(0),
                backend: None,
                fusion_kind: fuse_attr(f, "fusion_kind"),
                anchor: fuse_attr(f, "anchor"),
            }
        })
        .collect();
    Report {
        functions,
        main: main_entries,
        rejections: rejections
            .iter()
            .map(|r| RejectionReport {
                pattern: r.pattern.clone(),
                at: r.at.clone(),
                reason: r.reason.clone(),
            })
            .collect(),
        claims: Vec::new(),
        notes: valueless_note(m).into_iter().collect(),
    }
}

/// The note on constants without values, if the module has any.
fn valueless_note(m: &Module) -> Option<String> {
    let missing = m.valueless_constants();
    if missing.is_empty() {
        return None;
    }
    let names: Vec<String> = missing.iter().map(ToString::to_string).collect();
    Some(format!(
        "{} constant(s) have no value ({}): deduplication could not compare them, so functions that read them are shared only when they read the very same constants",
        missing.len(),
        names.join(", ")
    ))
}

impl Report {
    /// Pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
    }
}

const PALETTE: [&str; 8] = [
    "#8dd3c7", "#ffffb3", "#bebada", "#fb8072", "#80b1d3", "#fdb462", "#b3de69", "#fccde5",
];

fn esc(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

/// A DOT graph of `main`: one node per binding, one cluster per fused function call (its ops
/// listed inside), coloured by codegen (composite prefix for composites without `Codegen`).
pub fn to_dot(m: &Module) -> String {
    let mut out = String::from(
        "digraph fusebox {\n  rankdir=TB;\n  node [shape=box, style=\"rounded,filled\", fillcolor=white, fontname=\"monospace\"];\n",
    );
    let Some(main) = m.get("main") else {
        out.push_str("}\n");
        return out;
    };
    let mut colours: Vec<String> = Vec::new();
    let mut colour_of = |key: &str| -> &'static str {
        let i = match colours.iter().position(|c| c == key) {
            Some(i) => i,
            None => {
                colours.push(key.to_string());
                colours.len() - 1
            }
        };
        PALETTE[i % PALETTE.len()]
    };
    for &p in &main.params {
        let vd = main.var(p);
        out.push_str(&format!(
            "  v{} [label=\"{}\", shape=ellipse];\n",
            p.as_u32(),
            esc(&vd.name)
        ));
    }
    for (k, b) in main.bindings().enumerate() {
        let vd = main.var(b.var);
        let id = b.var.as_u32();
        match &main.expr(b.value).kind {
            ExprKind::Call {
                callee: Callee::Global(g),
                ..
            } => {
                let (mut ops, mut inner) = (Vec::new(), Vec::new());
                let f = m.get(g);
                if let Some(f) = f {
                    collect_ops(f, &mut ops, &mut inner);
                }
                let key = f
                    .and_then(|f| {
                        f.attrs.codegen.clone().or_else(|| {
                            f.attrs
                                .composite
                                .as_deref()
                                .and_then(|c| c.split('.').next())
                                .map(str::to_string)
                        })
                    })
                    .unwrap_or_else(|| "fused".into());
                let colour = colour_of(&key);
                out.push_str(&format!(
                    "  subgraph cluster_{k} {{\n    label=\"{} [{}]\";\n    style=filled; color=\"{colour}\";\n    v{id} [label=\"{} = {}\\n{}\"];\n  }}\n",
                    esc(g),
                    esc(&key),
                    esc(&vd.name),
                    esc(g),
                    ops.iter().map(|o| esc(o)).collect::<Vec<_>>().join("\\n")
                ));
            }
            ExprKind::Call {
                callee: Callee::Op(op),
                ..
            } => {
                out.push_str(&format!(
                    "  v{id} [label=\"{} = {}\"];\n",
                    esc(&vd.name),
                    op.name()
                ));
            }
            other => {
                let what = match other {
                    ExprKind::TupleGetItem(_, i) => format!("[{i}]"),
                    ExprKind::Tuple(_) => "tuple".into(),
                    _ => "value".into(),
                };
                out.push_str(&format!(
                    "  v{id} [label=\"{} = {what}\"];\n",
                    esc(&vd.name)
                ));
            }
        }
        let mut used = Vec::new();
        crate::pattern::matcher::operand_vars(main, b.value, &mut used);
        used.dedup();
        for u in used {
            out.push_str(&format!("  v{} -> v{id};\n", u.as_u32()));
        }
    }
    out.push_str("}\n");
    out
}
