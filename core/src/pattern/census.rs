//! Census of a function (which ops it calls, and which op calls take which op calls as
//! arguments) and the needs of a pattern (ops and edges that every match contains), so a pass
//! that tries many patterns skips, without visiting a root, a pattern that cannot match.
//!
//! - **Ops.** A call node `relax.op(...)` only matches a call of that op, so a pattern needs
//!   every op on a path from its root through calls, tuples, tuple-get-items, `&`, captures, dtype
//!   and shape constraints. `p | q` needs what both `p` and `q` need; `!p`, `_`, `const` and
//!   `var` need nothing.
//! - **Edges.** A call node whose argument node can only match calls of ops `H` (a call node, or
//!   an alternative of call nodes) needs a call of its op with an argument that is, after looking
//!   through vars bound to other values, a call of one of `H`.
//! - The census walks every binding's value with its sub-expressions (the only expressions the
//!   matcher visits) and looks through every var binding regardless of position, so it holds a
//!   superset of what any match can see: a missing need proves there is no match.
//!
//! ```text
//! pattern relax.nn.relu(relax.add(relax.add(relax.matmul(_, _), _), _))
//! needs   ops {relu, add, matmul}, edges {relu→add, add→add, add→matmul}
//! chain   matmul → add → relu → matmul → ...: no add→add edge, so the pattern is skipped
//! ```

use super::ast::{PatId, PatNode, Pattern};
use super::matcher::FunctionView;
use crate::ir::{Callee, ExprId, ExprKind, Function};
use rustc_hash::FxHashSet;

/// What every match of a pattern contains.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Needs<'p> {
    /// Ops that some matched call calls.
    pub ops: Vec<&'p str>,
    /// `(op, heads)`: a matched call of `op` has an argument that is a call of one of `heads`.
    pub edges: Vec<(&'p str, Vec<&'p str>)>,
}

/// At most this many pattern nodes are visited (shared sub-patterns are visited once per path);
/// beyond it the needs found so far are dropped (fewer needs only skip less).
const VISIT_LIMIT: usize = 4096;

impl Pattern {
    /// The ops and edges every match of this pattern contains (see the module doc).
    pub fn needs(&self) -> Needs<'_> {
        let mut budget = VISIT_LIMIT;
        let mut needs = self.needs_of(self.root, &mut budget);
        if budget == 0 {
            return Needs::default();
        }
        needs.ops.sort_unstable();
        needs.ops.dedup();
        for (_, heads) in &mut needs.edges {
            heads.sort_unstable();
            heads.dedup();
        }
        needs.edges.sort_unstable();
        needs.edges.dedup();
        needs
    }

    fn needs_of(&self, id: PatId, budget: &mut usize) -> Needs<'_> {
        let mut out = Needs::default();
        if *budget == 0 {
            return out;
        }
        *budget -= 1;
        let Some(node) = self.nodes.get(id) else {
            return out;
        };
        match node {
            PatNode::Call { op, args, .. } => {
                out.ops.push(op);
                for &a in args {
                    let sub = self.needs_of(a, budget);
                    out.ops.extend(sub.ops);
                    out.edges.extend(sub.edges);
                    if let Some(heads) = self.heads(a, &mut 64) {
                        out.edges.push((op, heads));
                    }
                }
            }
            PatNode::Tuple(fields) => {
                for &x in fields {
                    let sub = self.needs_of(x, budget);
                    out.ops.extend(sub.ops);
                    out.edges.extend(sub.edges);
                }
            }
            PatNode::And(a, b) => {
                for x in [*a, *b] {
                    let sub = self.needs_of(x, budget);
                    out.ops.extend(sub.ops);
                    out.edges.extend(sub.edges);
                }
            }
            PatNode::Or(a, b) => {
                let (x, y) = (self.needs_of(*a, budget), self.needs_of(*b, budget));
                out.ops = x.ops.into_iter().filter(|o| y.ops.contains(o)).collect();
                out.edges = x
                    .edges
                    .into_iter()
                    .filter(|e| y.edges.contains(e))
                    .collect();
            }
            PatNode::TupleGetItem(p, _)
            | PatNode::DType(p, _)
            | PatNode::Shape(p, _)
            | PatNode::Capture(_, p) => return self.needs_of(*p, budget),
            PatNode::Wildcard | PatNode::Const | PatNode::Var(_) | PatNode::Not(_) => {}
        }
        out
    }

    /// The ops an expression matched by node `id` must call, if it must be an op call.
    fn heads(&self, id: PatId, depth: &mut usize) -> Option<Vec<&str>> {
        if *depth == 0 {
            return None;
        }
        *depth -= 1;
        match self.nodes.get(id)? {
            PatNode::Call { op, .. } => Some(vec![op.as_str()]),
            PatNode::Or(a, b) => {
                let mut x = self.heads(*a, depth)?;
                x.extend(self.heads(*b, depth)?);
                Some(x)
            }
            PatNode::And(a, b) => match self.heads(*a, depth) {
                Some(x) => Some(x),
                None => self.heads(*b, depth),
            },
            PatNode::DType(p, _) | PatNode::Shape(p, _) | PatNode::Capture(_, p) => {
                self.heads(*p, depth)
            }
            _ => None,
        }
    }
}

/// Which ops a function calls and which op-to-op edges it has (see the module doc). Built in
/// two steps: the ops from the function alone, the edges (which need the use/def index) only
/// when a pattern's ops are all present.
#[derive(Debug, Default)]
pub struct Census {
    /// The distinct op names called, in first-seen order.
    ops: Vec<std::borrow::Cow<'static, str>>,
    /// `(parent, child)` indices into `ops`, packed as `parent << 16 | child`, once built.
    edges: Option<FxHashSet<u32>>,
}

impl Census {
    /// The ops called by the bindings of `f` (their values and sub-expressions).
    pub fn new(f: &Function) -> Self {
        let mut c = Census::default();
        let mut stack: Vec<ExprId> = Vec::new();
        for b in f.bindings() {
            stack.push(b.value);
            while let Some(e) = stack.pop() {
                let Some(d) = f.exprs.get(e) else { continue };
                match &d.kind {
                    ExprKind::Call { callee, args } => {
                        if let Callee::Op(op) = callee {
                            c.index_of(op);
                        }
                        stack.extend(args.iter().copied());
                    }
                    ExprKind::Tuple(xs) => stack.extend(xs.iter().copied()),
                    ExprKind::TupleGetItem(x, _) => stack.push(*x),
                    _ => {}
                }
            }
        }
        c
    }

    /// The index of `name` in `ops`, added when new.
    fn index_of(&mut self, op: &crate::op::Op) -> usize {
        let Some(name) = op.static_name() else {
            // An opaque op (outside the op set): its name is its own.
            let name = op.name();
            if let Some(i) = self.find(name) {
                return i;
            }
            self.ops.push(std::borrow::Cow::Owned(name.to_string()));
            return self.ops.len() - 1;
        };
        // Each op's name is one literal, so the pointer test almost always decides.
        if let Some(i) = self
            .ops
            .iter()
            .position(|s| std::ptr::eq(s.as_ptr(), name.as_ptr()) && s.len() == name.len())
        {
            return i;
        }
        if let Some(i) = self.ops.iter().position(|s| *s == name) {
            return i;
        }
        self.ops.push(std::borrow::Cow::Borrowed(name));
        self.ops.len() - 1
    }

    fn find(&self, name: &str) -> Option<usize> {
        self.ops.iter().position(|s| *s == name)
    }

    /// Whether every op of `needs` is called.
    pub fn has_ops(&self, needs: &Needs<'_>) -> bool {
        needs.ops.iter().all(|o| self.find(o).is_some())
    }

    /// Whether the edges have been built.
    pub fn has_edge_index(&self) -> bool {
        self.edges.is_some()
    }

    /// Builds the edges from the use/def index of the same function.
    pub fn build_edges(&mut self, view: &FunctionView<'_>) {
        let f = view.func;
        let mut edges: FxHashSet<u32> = FxHashSet::default();
        // Edges repeat (layers): a small direct-mapped memo of edges already added skips most
        // set insertions. `u32::MAX` is no edge (op indices stay below `u16::MAX`).
        let mut seen = [u32::MAX; 64];
        let mut stack: Vec<ExprId> = Vec::new();
        // Too many distinct ops to pack: no edge index (every edge need then holds).
        if self.ops.len() > u16::MAX as usize {
            return;
        }
        for b in f.bindings() {
            stack.push(b.value);
            while let Some(e) = stack.pop() {
                let Some(d) = f.exprs.get(e) else { continue };
                match &d.kind {
                    ExprKind::Call { callee, args } => {
                        if let Callee::Op(op) = callee {
                            let parent = self.index_of(op);
                            for &a in args {
                                let x = view.unwrap(a, usize::MAX);
                                if let Some(ExprKind::Call {
                                    callee: Callee::Op(child),
                                    ..
                                }) = f.exprs.get(x).map(|d| &d.kind)
                                {
                                    let child = self.index_of(child);
                                    let key = ((parent as u32) << 16) | child as u32;
                                    let slot = &mut seen[(key ^ (key >> 13)) as usize % 64];
                                    if *slot != key {
                                        *slot = key;
                                        edges.insert(key);
                                    }
                                }
                            }
                        }
                        stack.extend(args.iter().copied());
                    }
                    ExprKind::Tuple(xs) => stack.extend(xs.iter().copied()),
                    ExprKind::TupleGetItem(x, _) => stack.push(*x),
                    _ => {}
                }
            }
        }
        if self.ops.len() <= u16::MAX as usize {
            self.edges = Some(edges);
        }
    }

    /// Whether the function may hold a match with these needs: every op is called and, when the
    /// edges are built, every edge is present.
    pub fn may_match(&self, needs: &Needs<'_>) -> bool {
        if !self.has_ops(needs) {
            return false;
        }
        let Some(edges) = &self.edges else {
            return true;
        };
        needs.edges.iter().all(|(op, heads)| {
            let Some(p) = self.find(op) else {
                return false;
            };
            heads.iter().any(|h| {
                self.find(h)
                    .is_some_and(|c| edges.contains(&(((p as u32) << 16) | c as u32)))
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::generate::mlp_chain;
    use crate::pattern::parse_pattern;

    fn needs_of(text: &str) -> (Vec<String>, Vec<(String, Vec<String>)>) {
        let p = parse_pattern(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        let n = p.needs();
        (
            n.ops.iter().map(|s| s.to_string()).collect(),
            n.edges
                .iter()
                .map(|(o, h)| (o.to_string(), h.iter().map(|s| s.to_string()).collect()))
                .collect(),
        )
    }

    #[test]
    fn needs_follow_calls_and_intersect_alternatives() {
        let (ops, edges) = needs_of("relax.nn.relu(relax.add(relax.matmul(_, _), _))");
        assert_eq!(ops, ["relax.add", "relax.matmul", "relax.nn.relu"]);
        assert_eq!(
            edges,
            [
                ("relax.add".to_string(), vec!["relax.matmul".to_string()]),
                ("relax.nn.relu".to_string(), vec!["relax.add".to_string()]),
            ]
        );
        let (ops, edges) = needs_of("relax.nn.relu(relax.add(_, _) | relax.multiply(_, _))");
        assert_eq!(ops, ["relax.nn.relu"]);
        assert_eq!(
            edges,
            [(
                "relax.nn.relu".to_string(),
                vec!["relax.add".to_string(), "relax.multiply".to_string()]
            )]
        );
        let (ops, edges) = needs_of("relax.nn.relu(!relax.add(_, _))");
        assert_eq!(ops, ["relax.nn.relu"]);
        assert!(edges.is_empty());
    }

    #[test]
    fn census_rules_out_missing_ops_and_edges() {
        let m = mlp_chain(4);
        let Some(f) = m.get("main") else {
            panic!("no main")
        };
        let mut c = Census::new(f);
        let view = FunctionView::new(f);
        c.build_edges(&view);
        let may = |text: &str| {
            let p = parse_pattern(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            c.may_match(&p.needs())
        };
        assert!(may("relax.nn.relu(relax.add(relax.matmul(_, _), _))"));
        assert!(may("relax.matmul(relax.nn.relu(_), _)"));
        assert!(!may(
            "relax.nn.relu(relax.add(relax.add(relax.matmul(_, _), _), _))"
        ));
        assert!(!may("relax.matmul(_, relax.permute_dims(_))"));
        assert!(!may("relax.nn.gelu(_)"));
    }
}
