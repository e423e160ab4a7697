//! `fusebox explain`: why a binding of `main` ended where it did.
//!
//! Contract: [`BackendPipeline::explain`] partitions, claims and compiles the module as `run`
//! does, then follows the binding by its provenance ([`crate::ir::VarData::origin`]), not by
//! its name: FuseOps and FuseOpsByPattern rename the bindings they move (`lv1` becomes a param
//! or a var of `fused_conv2d_add_relu`, and `main` gets fresh `lv`/`gv` names), so a name
//! lookup in the partitioned `main` finds the wrong binding or none. It reports:
//!
//! 1. every pattern of the table, in application order (backend order, then priority, then
//!    list order), at this binding: the one that **won** (the `Composite` of the function that
//!    now holds the binding); the ones that matched and **lost** to it, and why (the winner
//!    comes earlier in application order and took the bindings first, or, where the winner
//!    comes later, the loser's match was not applied); the ones rejected by their check, with
//!    the reason; the ones that do not match (counted, not listed, in a table of more than
//!    12 patterns);
//! 2. the function it ended in (the unit `main` calls), its ops, the backend that runs it, and
//!    every backend that declined it or failed to compile it, with the reason; or that it
//!    stays in `main` on the CPU reference.
//!
//! An ONNX model's bindings have their node as origin: every binding one node lowered to is
//! followed, so a node split over two functions names both.
//!
//! ```text
//! $ fusebox explain examples/small_cnn.relax --config configs/cpu.toml --binding logits
//! binding `logits` of main: relax.add
//! patterns tried at it, in application order:
//!   (the pattern table is empty)
//! ended in `fused_matmul_add` (relax.matmul, relax.add), run by backend `cpu`
//! ```

use super::pipeline::BackendPipeline;
use super::registry;
use crate::error::{Error, Result};
use crate::ir::{Callee, ExprKind, Function, Module, VarId};
use std::fmt::Write;

/// Tables up to this size list every pattern; longer ones list those that match here and
/// count the rest.
const LIST_ALL: usize = 12;

/// Where a binding of the given origin ended: the top-level function holding it and the
/// `Composite` of the innermost function around it, if any.
struct Place {
    top: String,
    composite: Option<String>,
    /// Whether it is a binding of `main` itself.
    in_main: bool,
    /// For a binding of `main`: the function its value calls, if it is a call of one.
    calls: Option<String>,
}

/// Every binding of `f` (and of the local functions inside) whose origin is `origin` (or, for
/// a var with no origin in `main`, whose name is `name`).
fn find(
    f: &Function,
    top: &str,
    composite: Option<&str>,
    origin: &str,
    name: &str,
    out: &mut Vec<Place>,
) {
    let composite = f.attrs.composite.as_deref().or(composite);
    let mut deep = Vec::new();
    crate::ir::for_each_binding_deep(f, &f.blocks, &mut |b| deep.push(*b));
    for b in &deep {
        let v = f.var(b.var);
        let hit = if v.origin.is_empty() {
            top == "main" && v.name == name
        } else {
            v.origin.contains(origin)
        };
        match &f.expr(b.value).kind {
            ExprKind::Function(inner) => find(inner, top, composite, origin, name, out),
            kind if hit => out.push(Place {
                top: top.to_string(),
                composite: composite.map(str::to_string),
                in_main: top == "main",
                calls: match kind {
                    ExprKind::Call {
                        callee: Callee::Global(g),
                        ..
                    } => Some(g.to_string()),
                    _ => None,
                },
            }),
            _ => {}
        }
    }
}

/// The `Composite` of `f`, or of the first local function inside it that has one (the
/// composite a `Codegen` wrapper holds).
fn composite_of(f: &Function) -> Option<String> {
    f.attrs.composite.clone().or_else(|| {
        f.bindings().find_map(|b| match &f.expr(b.value).kind {
            ExprKind::Function(inner) => composite_of(inner),
            _ => None,
        })
    })
}

/// The function of `m` that calls `name` (`Global` callee), other than `main`.
fn caller_of<'m>(m: &'m Module, name: &str) -> Option<&'m str> {
    m.functions.iter().find_map(|(n, f)| {
        let calls = n != "main"
            && f.bindings().any(|b| {
                matches!(&f.expr(b.value).kind,
                    ExprKind::Call { callee: Callee::Global(g), .. } if g.as_ref() == name)
            });
        calls.then_some(n.as_str())
    })
}

impl BackendPipeline {
    /// Answers "why was binding `binding` of main (not) offloaded?" for `module` (see the
    /// module doc).
    pub fn explain(&self, module: &Module, binding: &str) -> Result<String> {
        use crate::pattern::{FunctionView, match_at};
        let top = module
            .get("main")
            .ok_or_else(|| Error::Invalid("the module has no `main` function".into()))?;
        // A binding inside a branch of an `if` is looked up in the branch as the passes see
        // it (a region function of its own; the first branch that binds the name).
        let lifted = if crate::transform::regions::has_if(module) {
            Some(crate::transform::regions::lift(module)?)
        } else {
            None
        };
        let candidates: Vec<&Function> = match &lifted {
            Some(l) => l
                .functions
                .iter()
                .filter(|(n, _)| {
                    n.as_str() == "main"
                        || (crate::transform::regions::is_region(n)
                            && crate::transform::regions::enclosing(n, l) == "main")
                })
                .map(|(_, f)| f)
                .collect(),
            None => vec![top],
        };
        let found = candidates.iter().find_map(|f| {
            f.bindings()
                .find(|b| f.var(b.var).name == binding)
                .map(|b| (*f, *b))
        });
        let Some((main, b)) = found else {
            let mut names: Vec<&str> = Vec::new();
            crate::ir::for_each_binding_deep(top, &top.blocks, &mut |b| {
                let n = top.var(b.var).name.as_str();
                if !names.contains(&n) {
                    names.push(n);
                }
            });
            return Err(Error::unknown(
                "binding of main",
                binding.to_string(),
                registry::valid_list(names),
            ));
        };
        let op = match &main.expr(b.value).kind {
            ExprKind::Call {
                callee: Callee::Op(op),
                ..
            } if op.name() == crate::transform::regions::IF_OP => "(an `if`)".to_string(),
            ExprKind::Call {
                callee: Callee::Op(op),
                ..
            } => op.name().to_string(),
            _ => "(not an op call)".to_string(),
        };
        let origin = main
            .var(b.var)
            .origin
            .first()
            .map_or_else(|| format!("main/{binding}"), str::to_string);
        let plan = self.run_for_report(module)?;

        // Where it went.
        let mut places = Vec::new();
        for (n, f) in &plan.module.functions {
            find(f, n, None, &origin, binding, &mut places);
        }
        let inside: Vec<&Place> = places.iter().filter(|p| !p.in_main).collect();
        let mut units: Vec<String> = Vec::new();
        let mut winner: Option<String> = None;
        let mut unit_of = |top: &str| {
            let is_unit = plan.claims.iter().any(|c| c.function == top);
            let u = if is_unit {
                top.to_string()
            } else {
                caller_of(&plan.module, top).unwrap_or(top).to_string()
            };
            if !units.contains(&u) {
                units.push(u);
            }
        };
        if inside.is_empty() {
            for p in &places {
                if let Some(g) = &p.calls {
                    unit_of(g);
                    if winner.is_none() {
                        winner = plan.module.get(g).and_then(composite_of);
                    }
                }
            }
        } else {
            for p in &inside {
                unit_of(&p.top);
                if winner.is_none() {
                    winner = p.composite.clone();
                }
            }
        }

        let at = format!("main/{binding}");
        let mut s = String::new();
        let _ = writeln!(s, "binding `{binding}` of main: {op}");
        if origin != at {
            let _ = writeln!(s, "from {origin}");
        }
        let _ = writeln!(s, "patterns tried at it, in application order:");
        let view = FunctionView::new(main);
        if self.table.is_empty() {
            let _ = writeln!(s, "  (the pattern table is empty)");
        }
        let winner_index = winner
            .as_deref()
            .and_then(|w| self.table.iter().position(|e| e.pattern.name == w));
        let mut unmatched = 0;
        for (i, e) in self.table.iter().enumerate() {
            let who = e.backend.as_deref().unwrap_or("user");
            let rejected_at = |root: &str| {
                plan.rejections
                    .iter()
                    .find(|r| r.pattern == e.pattern.name && r.at == format!("main/{root}"))
            };
            let root: Option<VarId> = if match_at(&e.pattern.pattern, &view, b.var).is_some() {
                Some(b.var)
            } else {
                main.bindings()
                    .find(|r| {
                        match_at(&e.pattern.pattern, &view, r.var)
                            .is_some_and(|mm| mm.nodes.iter().any(|(_, x)| *x == b.value))
                    })
                    .map(|r| r.var)
            };
            let Some(root) = root else {
                if self.table.len() <= LIST_ALL {
                    let _ = writeln!(
                        s,
                        "  {} [{who}]: does not match here, nor in a match that includes it",
                        e.pattern.name
                    );
                } else {
                    unmatched += 1;
                }
                continue;
            };
            let root_name = main.var(root).name.clone();
            let matched = if root == b.var {
                "matched here".to_string()
            } else {
                format!("matched as part of the match rooted at `{root_name}`")
            };
            let verdict = if let Some(r) = rejected_at(&root_name) {
                format!("{matched}, rejected: {}", r.reason)
            } else if winner.as_deref() == Some(e.pattern.name.as_str()) {
                format!(
                    "{matched}; won: its function holds this binding (the first pattern in \
                     application order to take it)"
                )
            } else if let (Some(w), Some(wi)) = (&winner, winner_index) {
                if wi < i {
                    format!(
                        "{matched}; lost to `{w}`, which comes earlier in application order \
                         (backend order, then priority) and took this binding first"
                    )
                } else {
                    format!(
                        "{matched}; lost: its match was not applied (it overlapped bindings an \
                         earlier pattern took), and the later `{w}` took this binding"
                    )
                }
            } else {
                format!(
                    "{matched}; not applied: it overlapped bindings an earlier pattern took, or \
                     its match leaves an intermediate used outside it"
                )
            };
            let _ = writeln!(s, "  {} [{who}]: {verdict}", e.pattern.name);
        }
        if unmatched > 0 {
            let _ = writeln!(
                s,
                "  ({unmatched} other pattern(s) do not match here, nor in a match that includes it)"
            );
        }
        if units.is_empty() {
            let _ = writeln!(
                s,
                "ended in no fused function: it stays in main and runs on the CPU reference"
            );
        }
        for u in &units {
            let Some(c) = plan.claims.iter().find(|c| &c.function == u) else {
                let _ = writeln!(s, "ended in `{u}`, which main does not call");
                continue;
            };
            let _ = writeln!(
                s,
                "ended in `{}` ({}), run by backend `{}`{}",
                c.function,
                c.ops.join(", "),
                c.backend.as_deref().unwrap_or("(none)"),
                if c.fallback {
                    " (fallback: no backend compiled it)"
                } else {
                    ""
                }
            );
            for (b, reason) in &c.declines {
                let _ = writeln!(s, "  declined by `{b}`: {reason}");
            }
            for (b, err) in &c.compile_failures {
                let _ = writeln!(s, "  compile failed in `{b}`: {err}");
            }
        }
        Ok(s)
    }
}
