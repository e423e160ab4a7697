//! The registry of built-in backends.
//!
//! Contract: a backend crate registers a constructor with
//! `inventory::submit! { BackendRegistration { name: "cpu", make: make_cpu } }`. On first use the
//! registrations are frozen into a map sorted by name; two registrations with one name are an
//! error (reported on every use, naming the name), as typetag does. [`make_backend`] builds a
//! backend from its options table; an unknown name lists the valid ones.
//!
//! Pitfall (see the ecosystem survey, §5.1): a crate nothing references is never linked, and its
//! `submit!` vanishes. The `fusebox` facade therefore calls every backend crate's `link()`; a
//! test there asserts the registry holds exactly the expected names. `inventory` is never used
//! across a `dlopen` boundary: plugins have an explicit C entry point instead.
//!
//! ```
//! // fusebox-core alone registers nothing; the facade links `cpu`.
//! assert!(fusebox_core::backend::registered_names().is_ok());
//! ```

use super::Backend;
use crate::error::{Error, Result};
use std::collections::BTreeMap;
use std::sync::OnceLock;

/// A built-in backend's constructor, submitted with `inventory::submit!`.
pub struct BackendRegistration {
    /// The backend's name, as written in configs.
    pub name: &'static str,
    /// Builds the backend from its `[backend.options]` table (empty when absent). Unknown
    /// options must be an error listing the valid ones.
    pub make: fn(&toml::Table) -> Result<Box<dyn Backend>>,
}

inventory::collect!(BackendRegistration);

type Frozen = std::result::Result<BTreeMap<&'static str, &'static BackendRegistration>, String>;

fn frozen() -> &'static Frozen {
    static REGISTRY: OnceLock<Frozen> = OnceLock::new();
    REGISTRY.get_or_init(|| {
        let mut map = BTreeMap::new();
        let mut dups = Vec::new();
        for r in inventory::iter::<BackendRegistration> {
            if map.insert(r.name, r).is_some() {
                dups.push(r.name);
            }
        }
        if dups.is_empty() {
            Ok(map)
        } else {
            dups.sort_unstable();
            dups.dedup();
            Err(format!(
                "backend name(s) registered more than once: {}",
                dups.join(", ")
            ))
        }
    })
}

/// The names of the registered built-in backends, sorted.
pub fn registered_names() -> Result<Vec<&'static str>> {
    match frozen() {
        Ok(m) => Ok(m.keys().copied().collect()),
        Err(e) => Err(Error::Invalid(e.clone())),
    }
}

/// Whether a built-in backend of this name is registered.
pub fn is_registered(name: &str) -> bool {
    matches!(frozen(), Ok(m) if m.contains_key(name))
}

/// Builds the built-in backend `name` with `options`.
pub fn make_backend(name: &str, options: &toml::Table) -> Result<Box<dyn Backend>> {
    let map = frozen().as_ref().map_err(|e| Error::Invalid(e.clone()))?;
    match map.get(name) {
        Some(r) => (r.make)(options),
        None => Err(Error::unknown(
            "backend",
            name.to_string(),
            valid_list(map.keys().copied()),
        )),
    }
}

/// `a, b, c`, or `(none)`.
pub fn valid_list<'a>(names: impl IntoIterator<Item = &'a str>) -> String {
    let v: Vec<&str> = names.into_iter().collect();
    if v.is_empty() {
        "(none)".to_string()
    } else {
        v.join(", ")
    }
}

/// Errors on any option key of `options` not in `valid` (for a backend's `make`).
pub fn check_options(backend: &str, options: &toml::Table, valid: &[&str]) -> Result<()> {
    for k in options.keys() {
        if !valid.contains(&k.as_str()) {
            return Err(Error::unknown(
                format!("option of backend `{backend}`"),
                k.clone(),
                valid_list(valid.iter().copied()),
            ));
        }
    }
    Ok(())
}
