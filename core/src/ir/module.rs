//! Modules: an ordered map from names to functions.

use super::expr::{ConstRef, ExprKind};
use super::function::Function;
use indexmap::IndexMap;

/// A module of functions, kept in definition order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Module {
    /// The functions, by name, in definition order.
    pub functions: IndexMap<String, Function>,
}

impl Module {
    /// An empty module.
    pub fn new() -> Self {
        Self::default()
    }

    /// The function named `name`.
    pub fn get(&self, name: &str) -> Option<&Function> {
        self.functions.get(name)
    }

    /// Adds (or replaces) a function.
    pub fn insert(&mut self, name: impl Into<String>, f: Function) {
        self.functions.insert(name.into(), f);
    }

    /// Function names sorted as TVM's printer sorts them (by name).
    pub fn sorted_names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.functions.keys().map(String::as_str).collect();
        names.sort_unstable();
        names
    }

    /// The constants without values ([`ConstRef`]) the functions hold, each once, in the order
    /// of the functions and their expressions (nested functions included).
    pub fn valueless_constants(&self) -> Vec<ConstRef> {
        fn walk(f: &Function, out: &mut Vec<ConstRef>) {
            for (_, d) in f.exprs.iter() {
                match &d.kind {
                    ExprKind::ConstRef(c) if !out.contains(c) => out.push(c.clone()),
                    ExprKind::Function(g) => walk(g, out),
                    _ => {}
                }
            }
        }
        let mut out = Vec::new();
        for f in self.functions.values() {
            walk(f, &mut out);
        }
        out
    }
}
