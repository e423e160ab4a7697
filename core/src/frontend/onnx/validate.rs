//! Whole-model checks that run before any node is converted: what onnxruntime (and the ONNX
//! checker) refuse, refused here too instead of imported with a guessed meaning.
//!
//! Contract: [`opset`] returns the default-domain opset, which must be in
//! [`MIN_OPSET`]`..=`[`MAX_OPSET`] (the range the converters have semantics for). [`graph`]
//! checks, in node order, that
//!
//! - initializer names are unique, and so are graph input names;
//! - every non-empty node input is a graph input, an initializer, or an output of an earlier
//!   node (an empty name is an omitted optional input);
//! - every non-empty node output is written once: by no other node, by no other output slot of
//!   the same node, and it does not shadow a graph input or an initializer;
//! - every attribute holds the value its declared `type` says (`INT` sets `i` and nothing else,
//!   and so on); an attribute without a type (`UNDEFINED`, written by very old exporters) is
//!   not checked;
//! - a node's attribute names are unique and, for an operator of the default domain, each is
//!   one some version of the operator's schema declares ([`super::schema_attrs`]): a misspelt
//!   attribute would otherwise be ignored and its default used (onnxruntime refuses it too,
//!   "Unrecognized attribute"). Other domains' operators are not checked.
//!
//! Every error is [`Error::Invalid`] naming the file and, for a node, its name (or `#index`) and
//! op type, then what was expected.
//!
//! ```text
//! graph(x): y = Relu(x); y = Neg(x)   → "m.onnx: node `n2` (Neg): output `y` is already written by node `n1` (Relu)"
//! y = GridSample(x, g, padding_mod2="border")
//!   → "m.onnx: node `n1` (GridSample): unknown attribute `padding_mod2`; GridSample's attributes are align_corners, mode, padding_mode"
//! ```

use super::node_name;
use super::proto::{AttributeProto, GraphProto, ModelProto, NodeProto};
use crate::error::{Error, Result};
use std::collections::HashMap;

/// The oldest default-domain opset the importer accepts.
pub const MIN_OPSET: i64 = 1;
/// The newest default-domain opset the importer accepts: that of the onnx release whose
/// backend and node tests it is checked against (onnx 1.23: opset 28). A newer opset may change
/// an op's meaning, which the converters would not know.
pub const MAX_OPSET: i64 = 28;

/// The default-domain opset of `model` (9 when the model imports none), checked against
/// [`MIN_OPSET`]`..=`[`MAX_OPSET`].
pub(super) fn opset(model: &ModelProto, file: &str) -> Result<i64> {
    let mut found: Option<i64> = None;
    for o in &model.opset_import {
        if !(o.domain.is_empty() || o.domain == "ai.onnx") {
            continue;
        }
        if !(MIN_OPSET..=MAX_OPSET).contains(&o.version) {
            return Err(Error::Invalid(format!(
                "{file}: opset_import: the default domain (\"{}\") has opset {}; fusebox imports \
                 opsets {MIN_OPSET} to {MAX_OPSET}",
                o.domain, o.version
            )));
        }
        match found {
            Some(v) if v != o.version => {
                return Err(Error::Invalid(format!(
                    "{file}: opset_import: the default domain is imported twice, with opsets {v} \
                     and {}",
                    o.version
                )));
            }
            _ => found = Some(o.version),
        }
    }
    Ok(found.unwrap_or(9))
}

/// Who defines a name.
#[derive(Clone)]
enum Def {
    Input,
    Initializer,
    Node(String),
}

impl std::fmt::Display for Def {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Def::Input => write!(f, "a graph input"),
            Def::Initializer => write!(f, "an initializer"),
            Def::Node(n) => write!(f, "node {n}"),
        }
    }
}

/// Checks the names and attributes of `g` (see the module docs).
pub(super) fn graph(g: &GraphProto, file: &str) -> Result<()> {
    let mut defs: HashMap<&str, Def> = HashMap::new();
    for t in &g.initializer {
        if defs.insert(t.name.as_str(), Def::Initializer).is_some() {
            return Err(Error::Invalid(format!(
                "{file}: initializer `{}` is defined twice; initializer names must be unique",
                t.name
            )));
        }
    }
    let mut inputs: HashMap<&str, ()> = HashMap::new();
    for vi in &g.input {
        if inputs.insert(vi.name.as_str(), ()).is_some() {
            return Err(Error::Invalid(format!(
                "{file}: graph input `{}` is listed twice; input names must be unique",
                vi.name
            )));
        }
        // An input that is also an initializer (IR < 4 lists initializers as inputs too) is
        // the initializer's default: one value.
        defs.entry(vi.name.as_str()).or_insert(Def::Input);
    }
    for (i, n) in g.node.iter().enumerate() {
        let at = || format!("{file}: node `{}` ({})", node_name(n, i), n.op_type);
        for name in n.input.iter().filter(|s| !s.is_empty()) {
            if !defs.contains_key(name.as_str()) {
                return Err(Error::Invalid(format!(
                    "{}: input `{name}` is not defined: expected a graph input, an initializer \
                     or an output of an earlier node",
                    at()
                )));
            }
        }
        for a in &n.attribute {
            attribute(a).map_err(|m| Error::Invalid(format!("{}: {m}", at())))?;
        }
        attribute_names(n).map_err(|m| Error::Invalid(format!("{}: {m}", at())))?;
        let me = format!("`{}` ({})", node_name(n, i), n.op_type);
        // This node's outputs so far (a set: a node may list any number of outputs).
        let mut mine = std::collections::HashSet::with_capacity(n.output.len());
        for name in &n.output {
            if name.is_empty() {
                continue;
            }
            if !mine.insert(name.as_str()) {
                return Err(Error::Invalid(format!(
                    "{}: output `{name}` is listed twice by this node; every value must be \
                     written exactly once",
                    at()
                )));
            }
            if let Some(prev) = defs.insert(name.as_str(), Def::Node(me.clone())) {
                let what = match prev {
                    Def::Node(_) => "is already written by",
                    _ => "shadows",
                };
                return Err(Error::Invalid(format!(
                    "{}: output `{name}` {what} {prev}; every value must be written exactly once",
                    at()
                )));
            }
        }
    }
    Ok(())
}

/// Checks that `n`'s attribute names are unique and, for a default-domain operator the schema
/// table knows, declared by its schema (see the module docs).
fn attribute_names(n: &NodeProto) -> Result<(), String> {
    // A set, not a scan of the earlier names: a node may carry any number of attributes.
    let mut seen = std::collections::HashSet::with_capacity(n.attribute.len());
    if let Some(a) = n.attribute.iter().find(|a| !seen.insert(a.name.as_str())) {
        return Err(format!(
            "attribute `{}` is given twice; an attribute name may appear once per node",
            a.name
        ));
    }
    if !(n.domain.is_empty() || n.domain == "ai.onnx") {
        return Ok(());
    }
    let table = super::schema_attrs::SCHEMA_ATTRS;
    let Ok(i) = table.binary_search_by(|(op, _)| (*op).cmp(n.op_type.as_str())) else {
        // An operator the schemas do not know: its converter reports it.
        return Ok(());
    };
    let known = table[i].1;
    match n
        .attribute
        .iter()
        .find(|a| known.binary_search(&a.name.as_str()).is_err())
    {
        None => Ok(()),
        Some(a) if known.is_empty() => Err(format!(
            "unknown attribute `{}`; {} takes no attributes",
            a.name, n.op_type
        )),
        Some(a) => Err(format!(
            "unknown attribute `{}`; {}'s attributes are {}",
            a.name,
            n.op_type,
            known.join(", ")
        )),
    }
}

/// `AttributeProto.type` codes and their names.
fn type_name(t: i32) -> &'static str {
    match t {
        1 => "FLOAT",
        2 => "INT",
        3 => "STRING",
        4 => "TENSOR",
        5 => "GRAPH",
        6 => "FLOATS",
        7 => "INTS",
        8 => "STRINGS",
        9 => "TENSORS",
        10 => "GRAPHS",
        11 => "SPARSE_TENSOR",
        12 => "SPARSE_TENSORS",
        13 => "TYPE_PROTO",
        14 => "TYPE_PROTOS",
        _ => "an unknown type",
    }
}

/// Checks that an attribute holds only the field its declared type names.
fn attribute(a: &AttributeProto) -> Result<(), String> {
    if a.r#type == 0 {
        return Ok(());
    }
    // The value fields this decoder models, with the type each belongs to.
    let set: [(bool, i32, &str); 8] = [
        (a.f.to_bits() != 0, 1, "f"),
        (a.i != 0, 2, "i"),
        (!a.s.is_empty(), 3, "s"),
        (a.t.is_some(), 4, "t"),
        (a.g.is_some(), 5, "g"),
        (!a.floats.is_empty(), 6, "floats"),
        (!a.ints.is_empty(), 7, "ints"),
        (!a.strings.is_empty(), 8, "strings"),
    ];
    let wrong: Vec<&str> = set
        .iter()
        .filter(|(is_set, ty, _)| *is_set && *ty != a.r#type)
        .map(|(_, _, f)| *f)
        .collect();
    if wrong.is_empty() {
        return Ok(());
    }
    let want = set
        .iter()
        .find(|(_, ty, _)| *ty == a.r#type)
        .map_or_else(String::new, |(_, _, f)| format!(" (field `{f}`)"));
    Err(format!(
        "attribute `{}` is declared {} ({}){want} but sets {}; expected the value in the field \
         its type names",
        a.name,
        type_name(a.r#type),
        a.r#type,
        wrong
            .iter()
            .map(|f| format!("`{f}`"))
            .collect::<Vec<_>>()
            .join(", ")
    ))
}
