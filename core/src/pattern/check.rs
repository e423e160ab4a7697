//! Checks: typed predicates that accept or reject a match, with a reason kept for the report.
//!
//! A check sees the root call, the named captures, the matched bindings, the uses of every var
//! and the types (through [`CheckContext`]) and returns [`Verdict::Accept`] or
//! [`Verdict::Reject`]. The stock [`NoLeakingIntermediates`] is the one every TVM backend starts
//! with:
//!
//! ```text
//! lv = R.matmul(x, w)      # intermediate of matmul+add
//! y  = R.add(lv, b)        # root
//! z  = R.nn.relu(lv)       # uses the intermediate outside the match: rejected
//! ```

use super::Pattern;
use super::matcher::{FunctionView, Match};
use crate::ir::{ExprId, Function, Type, VarId};
use std::sync::Arc;

/// A check's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Keep the match.
    Accept,
    /// Drop the match, for this reason.
    Reject {
        /// Why, in words a user can act on.
        reason: String,
    },
}

/// What a check can see.
pub struct CheckContext<'a, 'f> {
    /// The pattern that matched.
    pub pattern: &'a Pattern,
    /// The match.
    pub m: &'a Match,
    /// The function and its use/def index.
    pub view: &'a FunctionView<'f>,
    /// The vars of the matched bindings (root included), in binding order.
    pub matched: &'a [VarId],
}

impl CheckContext<'_, '_> {
    /// The function being partitioned.
    pub fn func(&self) -> &Function {
        self.view.func
    }

    /// The root binding's var.
    pub fn root(&self) -> VarId {
        self.m.root
    }

    /// The root call expression.
    pub fn root_call(&self) -> Option<ExprId> {
        self.view.bound(self.m.root).map(|(_, e)| e)
    }

    /// The value captured as `name`.
    pub fn capture(&self, name: &str) -> Option<ExprId> {
        self.m.capture(name)
    }

    /// The type of an expression.
    pub fn ty(&self, e: ExprId) -> Option<&Type> {
        self.view.func.exprs.get(e).map(|d| &d.ty)
    }

    /// The vars of the bindings that use `var`.
    pub fn users(&self, var: VarId) -> &[VarId] {
        self.view.users_of(var)
    }

    /// The var bound to a matched value, if it is bound.
    pub fn bound_var(&self, value: ExprId) -> Option<VarId> {
        self.view.value_var(value)
    }
}

/// A check on a match.
pub trait Check: Send + Sync {
    /// The check's name (as written in configs, e.g. `no_leaking_intermediates`).
    fn name(&self) -> &str;
    /// Accepts or rejects the match.
    fn check(&self, cx: &CheckContext<'_, '_>) -> Verdict;
}

/// Rejects a match when a value computed inside it, other than the root, is used outside it
/// (by a binding that is not matched, by the return, or after the block).
#[derive(Clone, Copy, Debug, Default)]
pub struct NoLeakingIntermediates;

impl Check for NoLeakingIntermediates {
    fn name(&self) -> &str {
        "no_leaking_intermediates"
    }

    fn check(&self, cx: &CheckContext<'_, '_>) -> Verdict {
        let f = cx.func();
        for &v in cx.matched {
            if v == cx.root() {
                continue;
            }
            let name = &f.var(v).name;
            if !f.var(v).dataflow {
                return Verdict::Reject {
                    reason: format!("intermediate `{name}` is visible after the dataflow block"),
                };
            }
            if cx.view.returned().contains(&v) {
                return Verdict::Reject {
                    reason: format!("intermediate `{name}` is returned"),
                };
            }
            if let Some(u) = cx.users(v).iter().find(|u| !cx.matched.contains(u)) {
                return Verdict::Reject {
                    reason: format!("intermediate `{name}` is also used by `{}`", f.var(*u).name),
                };
            }
        }
        Verdict::Accept
    }
}

/// The stock checks by name, for configs.
pub fn stock_check(name: &str) -> Option<Arc<dyn Check>> {
    match name {
        "no_leaking_intermediates" => Some(Arc::new(NoLeakingIntermediates)),
        _ => None,
    }
}

/// The names of the stock checks.
pub const STOCK_CHECKS: &[&str] = &["no_leaking_intermediates"];
