//! The pattern AST: an arena of nodes, with builders for every kind.

use crate::ir::entity::{Arena, entity_id};
use crate::ir::{DType, Dim};
use crate::op::AttrLit;
use std::fmt;

entity_id!(
    /// A node of a pattern's arena.
    PatId,
    "p"
);

/// One dim of a shape constraint: any extent, a static one, or a symbolic one.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ShapeDim {
    /// `?`: any extent.
    Any,
    /// A fixed dim (static or symbolic), compared structurally.
    Dim(Dim),
}

/// A pattern node.
#[derive(Clone, Debug, PartialEq)]
pub enum PatNode {
    /// `_`: matches anything.
    Wildcard,
    /// `const`: a tensor constant (also through a var bound to one).
    Const,
    /// `var` or `var("x")`: a var that is not bound in the block being matched (a parameter),
    /// optionally with that name.
    Var(Option<String>),
    /// `relax.op(args)`: a call of the op; `at_least` accepts extra trailing arguments
    /// (`relax.op(_, ...)`); `attrs` must all be present with equal values
    /// (`relax.nn.conv2d{groups=1}(_, _)`).
    Call {
        /// The op name, canonical (`relax.nn.conv2d`).
        op: String,
        /// The argument patterns.
        args: Vec<PatId>,
        /// Whether extra trailing arguments are allowed.
        at_least: bool,
        /// Attribute constraints.
        attrs: Vec<(String, AttrLit)>,
    },
    /// `(p, q)`: a tuple literal with exactly these fields.
    Tuple(Vec<PatId>),
    /// `p[i]` or `p[?]`: a tuple-get-item with this index or any index.
    TupleGetItem(PatId, Option<u32>),
    /// `p | q`: try `p`, then `q`.
    Or(PatId, PatId),
    /// `p & q`: both match the same expression.
    And(PatId, PatId),
    /// `!p`: matches when `p` does not.
    Not(PatId),
    /// `p : float16`: `p` matches and the value is a tensor of this dtype.
    DType(PatId, DType),
    /// `p : [?, 64]`: `p` matches and the value is a tensor of this shape.
    Shape(PatId, Vec<ShapeDim>),
    /// `name @ p`: `p` matches and the value is captured as `name`; the same name twice must bind
    /// the same value.
    Capture(String, PatId),
}

/// A graph-level constraint between two captures, checked against the uses in the block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EdgeKind {
    /// `a ^ b`: the value captured as `a` is an argument of the call captured as `b`.
    UsedBy,
    /// `a >> b`: as `UsedBy`, and `b` is the only user of `a`.
    OnlyUsedBy,
}

/// `a ^ b` / `a >> b` between two named captures.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct GraphConstraint {
    /// The producer capture.
    pub from: String,
    /// The consumer capture.
    pub to: String,
    /// The relation.
    pub kind: EdgeKind,
}

/// A dataflow pattern: an arena of nodes, a root, and graph-level constraints. Build one with
/// [`PatternBuilder`] or parse the text syntax.
#[derive(Clone, Debug, PartialEq)]
pub struct Pattern {
    pub(crate) nodes: Arena<PatId, PatNode>,
    pub(crate) root: PatId,
    pub(crate) constraints: Vec<GraphConstraint>,
}

impl Pattern {
    /// The root node.
    pub fn root(&self) -> PatId {
        self.root
    }

    /// A node.
    pub fn node(&self, id: PatId) -> &PatNode {
        &self.nodes[id]
    }

    /// The graph-level constraints.
    pub fn constraints(&self) -> &[GraphConstraint] {
        &self.constraints
    }

    /// Adds a graph-level constraint.
    pub fn with_constraint(mut self, from: &str, kind: EdgeKind, to: &str) -> Self {
        self.constraints.push(GraphConstraint {
            from: from.into(),
            to: to.into(),
            kind,
        });
        self
    }

    /// The op names a match can be rooted at (`None`: any call).
    pub fn root_ops(&self) -> Option<Vec<&str>> {
        let mut out = Vec::new();
        self.collect_root_ops(self.root, &mut out).then_some(out)
    }

    fn collect_root_ops<'a>(&'a self, id: PatId, out: &mut Vec<&'a str>) -> bool {
        match &self.nodes[id] {
            PatNode::Call { op, .. } => {
                out.push(op);
                true
            }
            PatNode::Or(a, b) => self.collect_root_ops(*a, out) && self.collect_root_ops(*b, out),
            PatNode::And(a, b) => {
                let mut x = Vec::new();
                if self.collect_root_ops(*a, &mut x) {
                    out.extend(x);
                    true
                } else {
                    self.collect_root_ops(*b, out)
                }
            }
            PatNode::DType(p, _) | PatNode::Shape(p, _) | PatNode::Capture(_, p) => {
                self.collect_root_ops(*p, out)
            }
            // Non-call roots never match (roots are call bindings): an empty list says so.
            PatNode::Const | PatNode::Var(_) | PatNode::Tuple(_) | PatNode::TupleGetItem(..) => {
                true
            }
            PatNode::Wildcard | PatNode::Not(_) => false,
        }
    }
}

/// Builds patterns node by node. Every method returns the new node's id.
///
/// ```
/// use fusebox_core::pattern::PatternBuilder;
/// let mut b = PatternBuilder::new();
/// let (x, w) = (b.wildcard(), b.constant());
/// let conv = b.call("relax.nn.conv2d", vec![x, w]);
/// let relu = b.call("relax.nn.relu", vec![conv]);
/// let p = b.finish(relu);
/// assert_eq!(p.to_string(), "relax.nn.relu(relax.nn.conv2d(_, const))");
/// ```
#[derive(Default)]
pub struct PatternBuilder {
    nodes: Arena<PatId, PatNode>,
}

impl PatternBuilder {
    /// An empty builder.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds any node.
    pub fn add(&mut self, node: PatNode) -> PatId {
        self.nodes.push(node)
    }

    /// `_`
    pub fn wildcard(&mut self) -> PatId {
        self.add(PatNode::Wildcard)
    }

    /// `const`
    pub fn constant(&mut self) -> PatId {
        self.add(PatNode::Const)
    }

    /// `var` / `var("name")`
    pub fn var(&mut self, name: Option<&str>) -> PatId {
        self.add(PatNode::Var(name.map(str::to_string)))
    }

    /// `op(args)` with exactly these arguments; `op` may omit the `relax.` prefix.
    pub fn call(&mut self, op: &str, args: Vec<PatId>) -> PatId {
        self.add(PatNode::Call {
            op: canonical_op(op),
            args,
            at_least: false,
            attrs: Vec::new(),
        })
    }

    /// `op(args, ...)`: at least these arguments.
    pub fn call_at_least(&mut self, op: &str, args: Vec<PatId>) -> PatId {
        self.add(PatNode::Call {
            op: canonical_op(op),
            args,
            at_least: true,
            attrs: Vec::new(),
        })
    }

    /// `op{attrs}(args)`.
    pub fn call_with_attrs(
        &mut self,
        op: &str,
        attrs: Vec<(String, AttrLit)>,
        args: Vec<PatId>,
    ) -> PatId {
        self.add(PatNode::Call {
            op: canonical_op(op),
            args,
            at_least: false,
            attrs,
        })
    }

    /// `(fields)`
    pub fn tuple(&mut self, fields: Vec<PatId>) -> PatId {
        self.add(PatNode::Tuple(fields))
    }

    /// `p[i]`, or `p[?]` with `None`.
    pub fn tuple_get_item(&mut self, p: PatId, index: Option<u32>) -> PatId {
        self.add(PatNode::TupleGetItem(p, index))
    }

    /// `p | q`
    pub fn or(&mut self, p: PatId, q: PatId) -> PatId {
        self.add(PatNode::Or(p, q))
    }

    /// `p & q`
    pub fn and(&mut self, p: PatId, q: PatId) -> PatId {
        self.add(PatNode::And(p, q))
    }

    /// `!p`
    pub fn not(&mut self, p: PatId) -> PatId {
        self.add(PatNode::Not(p))
    }

    /// `p : dtype`
    pub fn dtype(&mut self, p: PatId, d: DType) -> PatId {
        self.add(PatNode::DType(p, d))
    }

    /// `p : [dims]`
    pub fn shape(&mut self, p: PatId, dims: Vec<ShapeDim>) -> PatId {
        self.add(PatNode::Shape(p, dims))
    }

    /// `name @ p`
    pub fn capture(&mut self, name: &str, p: PatId) -> PatId {
        self.add(PatNode::Capture(name.to_string(), p))
    }

    /// The pattern rooted at `root`.
    pub fn finish(self, root: PatId) -> Pattern {
        Pattern {
            nodes: self.nodes,
            root,
            constraints: Vec::new(),
        }
    }
}

/// `nn.relu` → `relax.nn.relu`; names already starting with `relax.` are kept.
pub fn canonical_op(op: &str) -> String {
    if op.starts_with("relax.") {
        op.to_string()
    } else {
        format!("relax.{op}")
    }
}

/// Precedence levels for printing: `|` < `&` < `@` < `:` < postfix/atoms.
fn prec(n: &PatNode) -> u8 {
    match n {
        PatNode::Or(..) => 1,
        PatNode::And(..) => 2,
        PatNode::Capture(..) => 3,
        PatNode::DType(..) | PatNode::Shape(..) => 4,
        PatNode::Not(_) => 5,
        _ => 6,
    }
}

impl Pattern {
    fn fmt_node(&self, id: PatId, f: &mut fmt::Formatter<'_>, min: u8) -> fmt::Result {
        let node = &self.nodes[id];
        let p = prec(node);
        if p < min {
            f.write_str("(")?;
        }
        match node {
            PatNode::Wildcard => f.write_str("_")?,
            PatNode::Const => f.write_str("const")?,
            PatNode::Var(None) => f.write_str("var")?,
            PatNode::Var(Some(n)) => write!(f, "var({})", quoted(n))?,
            PatNode::Call {
                op,
                args,
                at_least,
                attrs,
            } => {
                f.write_str(op)?;
                if !attrs.is_empty() {
                    f.write_str("{")?;
                    for (i, (k, v)) in attrs.iter().enumerate() {
                        if i > 0 {
                            f.write_str(", ")?;
                        }
                        write!(f, "{k}=")?;
                        fmt_lit(v, f)?;
                    }
                    f.write_str("}")?;
                }
                f.write_str("(")?;
                for (i, a) in args.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    self.fmt_node(*a, f, 1)?;
                }
                if *at_least {
                    f.write_str(if args.is_empty() { "..." } else { ", ..." })?;
                }
                f.write_str(")")?;
            }
            PatNode::Tuple(fields) => {
                f.write_str("(")?;
                for (i, a) in fields.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    self.fmt_node(*a, f, 1)?;
                }
                if fields.len() == 1 {
                    f.write_str(",")?;
                }
                f.write_str(")")?;
            }
            PatNode::TupleGetItem(t, i) => {
                self.fmt_node(*t, f, 6)?;
                match i {
                    Some(i) => write!(f, "[{i}]")?,
                    None => f.write_str("[?]")?,
                }
            }
            PatNode::Or(a, b) => {
                self.fmt_node(*a, f, 1)?;
                f.write_str(" | ")?;
                self.fmt_node(*b, f, 2)?;
            }
            PatNode::And(a, b) => {
                self.fmt_node(*a, f, 2)?;
                f.write_str(" & ")?;
                self.fmt_node(*b, f, 3)?;
            }
            PatNode::Not(a) => {
                f.write_str("!")?;
                self.fmt_node(*a, f, 5)?;
            }
            // Suffixes chain without parentheses (`x : float16 : [?, 4]`), as they parse: a
            // printed form must not nest deeper than its source (the parser bounds depth).
            PatNode::DType(a, d) => {
                self.fmt_node(*a, f, 4)?;
                write!(f, " : {d}")?;
            }
            PatNode::Shape(a, dims) => {
                self.fmt_node(*a, f, 4)?;
                f.write_str(" : [")?;
                for (i, d) in dims.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    match d {
                        ShapeDim::Any => f.write_str("?")?,
                        ShapeDim::Dim(d) => write!(f, "{d}")?,
                    }
                }
                f.write_str("]")?;
            }
            // `a @ b @ p` is `a @ (b @ p)`: a capture inside a capture needs no parentheses.
            PatNode::Capture(name, a) => {
                write!(f, "{name} @ ")?;
                self.fmt_node(*a, f, 3)?;
            }
        }
        if p < min {
            f.write_str(")")?;
        }
        Ok(())
    }
}

/// `s` in double quotes with the only escapes the pattern syntax reads, `\"` and `\\`; every
/// other character as it is (Rust's `{:?}` writes `\0`, `\n`, `\u{..}`, which the syntax
/// does not read back: found by the parse_pattern fuzz target).
fn quoted(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        if matches!(c, '"' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

fn fmt_lit(v: &AttrLit, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    match v {
        AttrLit::None => f.write_str("None"),
        AttrLit::Bool(b) => f.write_str(if *b { "True" } else { "False" }),
        AttrLit::Int(i) => write!(f, "{i}"),
        AttrLit::Float(x) => write!(f, "{x:?}"),
        AttrLit::Str(s) => f.write_str(&quoted(s)),
        AttrLit::List(items) => {
            f.write_str("[")?;
            for (i, it) in items.iter().enumerate() {
                if i > 0 {
                    f.write_str(", ")?;
                }
                fmt_lit(it, f)?;
            }
            f.write_str("]")
        }
        AttrLit::IndexMap(m) => f.write_str(&quoted(&m.to_string())),
    }
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.fmt_node(self.root, f, 0)?;
        for (i, c) in self.constraints.iter().enumerate() {
            f.write_str(if i == 0 { " where " } else { ", " })?;
            let op = match c.kind {
                EdgeKind::UsedBy => "^",
                EdgeKind::OnlyUsedBy => ">>",
            };
            write!(f, "{} {op} {}", c.from, c.to)?;
        }
        Ok(())
    }
}
