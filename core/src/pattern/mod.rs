//! Dataflow patterns: the AST and its builders, the text syntax, TVM-shaped helper builders, and
//! the matcher.
//!
//! One pattern AST, three front doors: Rust builders ([`PatternBuilder`] and the helpers in
//! [`helpers`]), the text syntax ([`parse_pattern`]), and the built-in tables of backends.
//!
//! ```text
//! relax.nn.relu(relax.add(relax.nn.conv2d(_, const), _))
//! ```

mod ast;
pub mod census;
pub mod check;
pub mod helpers;
pub mod matcher;
mod syntax;

pub use ast::{
    EdgeKind, GraphConstraint, PatId, PatNode, Pattern, PatternBuilder, ShapeDim, canonical_op,
};
pub use matcher::{FunctionView, Match, match_at};
pub use syntax::parse_pattern;

use crate::op::AttrLit;

/// Attribute equality for constraints: lists and tuples compare element-wise, ints equal floats
/// of the same value.
pub fn attr_lit_eq(actual: &AttrLit, want: &AttrLit) -> bool {
    match (actual, want) {
        (AttrLit::List(a), AttrLit::List(b)) => {
            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| attr_lit_eq(x, y))
        }
        (AttrLit::Int(a), AttrLit::Float(b)) | (AttrLit::Float(b), AttrLit::Int(a)) => {
            (*a as f64) == *b
        }
        (AttrLit::IndexMap(a), AttrLit::Str(s)) => {
            crate::op::IndexMap::parse(s).is_ok_and(|m| m == *a)
        }
        _ => actual == want,
    }
}
