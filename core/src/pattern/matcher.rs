//! Tree matching of a pattern at a root binding, with TVM's semantics.
//!
//! - **Look-through.** Before a node is matched, a var bound at or before the root is replaced by
//!   its bound value, repeatedly (through alias chains). So `relax.nn.relu(relax.add(_, _))`
//!   matches `a = R.add(x, y); r = R.nn.relu(a)` at `r`, and `var` only matches unbound vars
//!   (parameters, or values bound after the root).
//! - **Sharing.** A pattern node reached twice (a shared sub-pattern) and a capture name used
//!   twice must bind the same value. Failed alternatives roll their bindings back.
//! - **Arity** is exact unless the call pattern says `...`; **commutativity**: when the in-order
//!   match of `relax.add` or `relax.multiply` fails, the swapped order is tried.
//! - **Attributes** are compared only where the pattern constrains them.
//!
//! ```text
//! pattern: relax.nn.relu(relax.nn.conv2d(_, const))
//! lv = R.nn.conv2d(x, metadata["relax.expr.Constant"][0], ...)   # matched (interior)
//! y  = R.nn.relu(lv)                                              # root
//! ```

use super::ast::{EdgeKind, PatId, PatNode, Pattern, ShapeDim};
use crate::ir::{Callee, EntityId, ExprId, ExprKind, Function, Type, VarId};

/// The bindings of one function seen by the matcher: where each var is bound, which var each
/// value is bound to, and who uses each var. Side tables are dense vectors indexed by id, so
/// building a view is linear and cheap.
pub struct FunctionView<'f> {
    /// The function.
    pub func: &'f Function,
    t: std::sync::Arc<ViewTables>,
}

/// The side tables of a [`FunctionView`], shareable between views of the same (unchanged)
/// function, so a pass that tries many patterns indexes a function once. The per-id tables are
/// zeroed when made and 0 means "none" (values are stored plus one), so the entries of params
/// and of expressions that are not bound cost no writes.
pub struct ViewTables {
    /// Per var: `(position + 1) << 32 | value` when bound; positions count bindings across
    /// blocks.
    bound: Vec<u64>,
    /// Per expression: the var it is bound to plus one, when it is a binding's value.
    value_var: Vec<u32>,
    /// Per var: the block index of its binding plus one (0 for params).
    block_of: Vec<u32>,
    /// Users of each var (CSR): `users[user_start[v]..user_start[v + 1]]`.
    user_start: Vec<u32>,
    users: Vec<VarId>,
    /// Vars used by the function's return expression.
    returned: Vec<VarId>,
}

impl<'f> FunctionView<'f> {
    /// Indexes `func`.
    pub fn new(func: &'f Function) -> Self {
        let nv = func.vars.len();
        let mut bound: Vec<u64> = vec![0; nv];
        let mut value_var: Vec<u32> = vec![0; func.exprs.len()];
        let mut block_of: Vec<u32> = vec![0; nv];
        let nbind: usize = func.blocks.iter().map(|b| b.bindings.len()).sum();
        let mut edges: Vec<(VarId, VarId)> = Vec::with_capacity(nbind * 2);
        let mut pos = 0u32;
        let mut used = Vec::new();
        for (bi, block) in func.blocks.iter().enumerate() {
            for b in &block.bindings {
                if let Some(slot) = bound.get_mut(b.var.index()) {
                    *slot = ((u64::from(pos) + 1) << 32) | u64::from(b.value.as_u32());
                }
                if let (Some(slot), Some(v1)) = (
                    value_var.get_mut(b.value.index()),
                    b.var.as_u32().checked_add(1),
                ) {
                    *slot = v1;
                }
                if let (Some(slot), Ok(b1)) =
                    (block_of.get_mut(b.var.index()), u32::try_from(bi + 1))
                {
                    *slot = b1;
                }
                used.clear();
                operand_vars(func, b.value, &mut used);
                match used.len() {
                    0 | 1 => {}
                    2 => {
                        if used[0] == used[1] {
                            used.pop();
                        } else if used[0] > used[1] {
                            used.swap(0, 1);
                        }
                    }
                    _ => {
                        used.sort_unstable();
                        used.dedup();
                    }
                }
                edges.extend(used.iter().map(|&u| (u, b.var)));
                pos += 1;
            }
        }
        // Counting sort of the (used, user) edges by `used`, keeping binding order per var.
        let mut user_start = vec![0u32; nv + 1];
        for &(u, _) in &edges {
            if u.index() < nv {
                user_start[u.index() + 1] += 1;
            }
        }
        for i in 0..nv {
            user_start[i + 1] += user_start[i];
        }
        let mut fill = user_start.clone();
        let mut users = vec![VarId::new(0); edges.len()];
        for &(u, user) in &edges {
            if u.index() < nv {
                let slot = &mut fill[u.index()];
                users[*slot as usize] = user;
                *slot += 1;
            }
        }
        let mut returned = Vec::new();
        if let Some(r) = func.ret {
            operand_vars(func, r, &mut returned);
        }
        let t = std::sync::Arc::new(ViewTables {
            bound,
            value_var,
            block_of,
            user_start,
            users,
            returned,
        });
        FunctionView { func, t }
    }

    /// A view of `func` over tables built earlier for the same, unchanged function.
    pub fn with_tables(func: &'f Function, t: std::sync::Arc<ViewTables>) -> Self {
        FunctionView { func, t }
    }

    /// The side tables, to reuse for another view of the same function.
    pub fn tables(&self) -> std::sync::Arc<ViewTables> {
        self.t.clone()
    }

    /// Vars used by the function's return expression.
    pub fn returned(&self) -> &[VarId] {
        &self.t.returned
    }

    /// `(position, value)` of the binding of `var`, if it is bound.
    #[inline]
    pub fn bound(&self, var: VarId) -> Option<(usize, ExprId)> {
        match self.t.bound.get(var.index()) {
            Some(&x) if x != 0 => Some((
                ((x >> 32) - 1) as usize,
                ExprId::new((x & u64::from(u32::MAX)) as usize),
            )),
            _ => None,
        }
    }

    /// The var bound to `value`, if `value` is a binding's value.
    #[inline]
    pub fn value_var(&self, value: ExprId) -> Option<VarId> {
        match self.t.value_var.get(value.index()) {
            Some(&v) if v != 0 => Some(VarId::new((v - 1) as usize)),
            _ => None,
        }
    }

    /// The index of the block that binds `var` (`None` for params).
    #[inline]
    pub fn block_of(&self, var: VarId) -> Option<usize> {
        match self.t.block_of.get(var.index()) {
            Some(&b) if b != 0 => Some((b - 1) as usize),
            _ => None,
        }
    }

    /// The vars of the bindings that use `var`, in binding order.
    pub fn users_of(&self, var: VarId) -> &[VarId] {
        let i = var.index();
        match (self.t.user_start.get(i), self.t.user_start.get(i + 1)) {
            (Some(&a), Some(&b)) => self.t.users.get(a as usize..b as usize).unwrap_or(&[]),
            _ => &[],
        }
    }

    /// Follows var → bound value (bound at or before `limit`) repeatedly.
    pub fn unwrap(&self, mut e: ExprId, limit: usize) -> ExprId {
        for _ in 0..self.t.bound.len() + 1 {
            match self.func.exprs.get(e).map(|d| &d.kind) {
                Some(ExprKind::Var(v)) => match self.bound(*v) {
                    Some((pos, value)) if pos <= limit => e = value,
                    _ => return e,
                },
                _ => return e,
            }
        }
        e
    }
}

/// Adds every var that expression `e` uses (vars in call args, tuple fields, the tuple of a
/// tuple-get-item, local callees; or `e` itself when it is a var).
pub fn operand_vars(f: &Function, e: ExprId, out: &mut Vec<VarId>) {
    let Some(d) = f.exprs.get(e) else { return };
    match &d.kind {
        ExprKind::Var(v) => out.push(*v),
        ExprKind::Call { callee, args } => {
            if let Callee::Local(v) = callee {
                out.push(*v);
            }
            for &a in args {
                // Arguments are mostly vars: take those without a call.
                match f.exprs.get(a).map(|d| &d.kind) {
                    Some(ExprKind::Var(v)) => out.push(*v),
                    _ => operand_vars(f, a, out),
                }
            }
        }
        ExprKind::Tuple(xs) => xs.iter().for_each(|&x| operand_vars(f, x, out)),
        ExprKind::TupleGetItem(x, _) => operand_vars(f, *x, out),
        _ => {}
    }
}

/// A successful match.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Match {
    /// The root binding's var.
    pub root: VarId,
    /// `(pattern node, matched expression)` for every node visited, in visit order; expressions
    /// are the looked-through values.
    pub nodes: Vec<(PatId, ExprId)>,
    /// Named captures, in first-capture order.
    pub captures: Vec<(String, ExprId)>,
}

impl Default for Match {
    /// An empty match (root `v0`), to reuse with [`match_into`].
    fn default() -> Self {
        Match {
            root: VarId::new(0),
            nodes: Vec::new(),
            captures: Vec::new(),
        }
    }
}

impl Match {
    /// The captured value for `name`.
    pub fn capture(&self, name: &str) -> Option<ExprId> {
        self.captures
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, e)| *e)
    }

    /// The vars of the bindings matched by call and tuple-get-item nodes (the root included), in
    /// binding order, without duplicates. Wildcards, constants and vars are leaves: what they
    /// match stays outside.
    pub fn bindings(&self, p: &Pattern, view: &FunctionView<'_>) -> Vec<VarId> {
        let mut out = Vec::new();
        self.bindings_into(p, view, &mut Vec::new(), &mut out);
        out
    }

    /// [`Match::bindings`] into `out` (cleared first), with `scratch` as working space.
    pub fn bindings_into(
        &self,
        p: &Pattern,
        view: &FunctionView<'_>,
        scratch: &mut Vec<(usize, VarId)>,
        out: &mut Vec<VarId>,
    ) {
        scratch.clear();
        out.clear();
        for &(pid, e) in &self.nodes {
            if matches!(
                p.node(pid),
                PatNode::Call { .. } | PatNode::TupleGetItem(..)
            ) && let Some(v) = view.value_var(e)
                && let Some((pos, _)) = view.bound(v)
                && !scratch.iter().any(|&(_, w)| w == v)
            {
                scratch.push((pos, v));
            }
        }
        scratch.sort_unstable();
        out.extend(scratch.iter().map(|&(_, v)| v));
    }
}

struct Matcher<'a, 'f, 'm> {
    p: &'a Pattern,
    view: &'a FunctionView<'f>,
    limit: usize,
    memo: &'m mut Vec<(PatId, ExprId)>,
    captures: &'m mut Vec<(String, ExprId)>,
    depth: usize,
}

/// Matches `p` at the binding of `root` (a call binding at position `pos`). Only bindings at or
/// before `pos` are looked through.
pub fn match_at(p: &Pattern, view: &FunctionView<'_>, root: VarId) -> Option<Match> {
    let mut m = Match {
        root,
        nodes: Vec::new(),
        captures: Vec::new(),
    };
    match_into(p, view, root, &mut m).then_some(m)
}

/// [`match_at`] into `out`, reusing its buffers (a pass that tries many roots allocates once).
/// Returns whether the pattern matched; `out` holds the match only then.
pub fn match_into(p: &Pattern, view: &FunctionView<'_>, root: VarId, out: &mut Match) -> bool {
    out.root = root;
    out.nodes.clear();
    out.captures.clear();
    let Some((pos, value)) = view.bound(root) else {
        return false;
    };
    if !matches!(
        view.func.exprs.get(value).map(|d| &d.kind),
        Some(ExprKind::Call { .. })
    ) {
        return false;
    }
    let mut m = Matcher {
        p,
        view,
        limit: pos,
        memo: &mut out.nodes,
        captures: &mut out.captures,
        depth: 0,
    };
    if !m.visit(p.root(), value) {
        return false;
    }
    for c in p.constraints() {
        let (Some(a), Some(b)) = (out.capture(&c.from), out.capture(&c.to)) else {
            return false;
        };
        let (Some(va), Some(vb)) = (view.value_var(a), view.value_var(b)) else {
            return false;
        };
        let users = view.users_of(va);
        let ok = match c.kind {
            EdgeKind::UsedBy => users.contains(&vb),
            EdgeKind::OnlyUsedBy => users == [vb] && !view.returned().contains(&va),
        };
        if !ok {
            return false;
        }
    }
    true
}

impl<'a, 'f> Matcher<'a, 'f, '_> {
    fn visit(&mut self, pid: PatId, e0: ExprId) -> bool {
        if self.depth > 512 {
            return false;
        }
        let e = self.view.unwrap(e0, self.limit);
        if let Some(&(_, prev)) = self.memo.iter().find(|(p, _)| *p == pid) {
            return prev == e;
        }
        let mark = (self.memo.len(), self.captures.len());
        self.memo.push((pid, e));
        self.depth += 1;
        let ok = self.visit_node(pid, e);
        self.depth -= 1;
        if !ok {
            self.memo.truncate(mark.0);
            self.captures.truncate(mark.1);
        }
        ok
    }

    fn visit_node(&mut self, pid: PatId, e: ExprId) -> bool {
        // Borrowed for the pattern's and the function's lifetimes, not `self`'s, so the
        // recursive visits below need no copies of argument lists.
        let (p, view): (&'a Pattern, &'a FunctionView<'f>) = (self.p, self.view);
        let func: &'f Function = view.func;
        let Some(data) = func.exprs.get(e) else {
            return false;
        };
        match p.node(pid) {
            PatNode::Wildcard => true,
            PatNode::Const => matches!(data.kind, ExprKind::Const(_) | ExprKind::ConstRef(_)),
            PatNode::Var(name) => match &data.kind {
                ExprKind::Var(v) => name.as_ref().is_none_or(|n| func.var(*v).name == *n),
                _ => false,
            },
            PatNode::Call {
                op,
                args,
                at_least,
                attrs,
            } => {
                let ExprKind::Call {
                    callee: Callee::Op(actual),
                    args: eargs,
                } = &data.kind
                else {
                    return false;
                };
                if actual.name() != op {
                    return false;
                }
                if !attrs.is_empty() {
                    let kw = actual.kwargs();
                    let all = attrs.iter().all(|(k, v)| {
                        kw.iter()
                            .any(|(ak, av)| ak == k && crate::pattern::attr_lit_eq(av, v))
                    });
                    if !all {
                        return false;
                    }
                }
                let arity_ok = if *at_least {
                    eargs.len() >= args.len()
                } else {
                    eargs.len() == args.len()
                };
                if !arity_ok {
                    return false;
                }
                if self.visit_seq(args, eargs) {
                    return true;
                }
                if (op == "relax.add" || op == "relax.multiply")
                    && args.len() == 2
                    && eargs.len() == 2
                {
                    return self.visit_seq(&[args[1], args[0]], eargs);
                }
                false
            }
            PatNode::Tuple(fields) => match &data.kind {
                ExprKind::Tuple(xs) if xs.len() == fields.len() => self.visit_seq(fields, xs),
                _ => false,
            },
            PatNode::TupleGetItem(t, idx) => match &data.kind {
                ExprKind::TupleGetItem(x, i) if idx.is_none_or(|want| want == *i) => {
                    let (t, x) = (*t, *x);
                    self.visit(t, x)
                }
                _ => false,
            },
            PatNode::Or(a, b) => {
                let (a, b) = (*a, *b);
                self.visit(a, e) || self.visit(b, e)
            }
            PatNode::And(a, b) => {
                let (a, b) = (*a, *b);
                self.visit(a, e) && self.visit(b, e)
            }
            PatNode::Not(a) => {
                let a = *a;
                let mark = (self.memo.len(), self.captures.len());
                let matched = self.visit(a, e);
                self.memo.truncate(mark.0);
                self.captures.truncate(mark.1);
                !matched
            }
            PatNode::DType(a, d) => {
                let a = *a;
                matches!(&data.ty, Type::Tensor(t) if t.dtype == Some(*d)) && self.visit(a, e)
            }
            PatNode::Shape(a, dims) => {
                let a = *a;
                let ok = match &data.ty {
                    Type::Tensor(t) => t.dims.as_ref().is_some_and(|ds| {
                        ds.len() == dims.len()
                            && ds.iter().zip(dims).all(|(d, want)| match want {
                                ShapeDim::Any => true,
                                ShapeDim::Dim(w) => d == w,
                            })
                    }),
                    _ => false,
                };
                ok && self.visit(a, e)
            }
            PatNode::Capture(name, a) => {
                let a = *a;
                if let Some((_, prev)) = self.captures.iter().find(|(n, _)| n == name) {
                    return *prev == e && self.visit(a, e);
                }
                self.captures.push((name.clone(), e));
                self.visit(a, e)
            }
        }
    }

    fn visit_seq(&mut self, pats: &[PatId], exprs: &[ExprId]) -> bool {
        let mark = (self.memo.len(), self.captures.len());
        for (&p, &x) in pats.iter().zip(exprs) {
            if !self.visit(p, x) {
                self.memo.truncate(mark.0);
                self.captures.truncate(mark.1);
                return false;
            }
        }
        true
    }
}
