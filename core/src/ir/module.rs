//! Modules: an ordered map from names to functions.

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
}
