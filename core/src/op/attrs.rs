//! Reading typed attributes out of keyword literals, and writing them back.
//!
//! Every reader takes the attribute name and either a default (used when the attribute is
//! absent) or `None` for a required attribute. Errors name the op, the attribute, what was
//! expected and what was found.

use super::{AttrLit, F64};
use crate::ir::DType;

/// The keyword attributes of one call, checked against the op's attribute names.
pub(crate) struct Kwargs<'a> {
    op: &'a str,
    kw: &'a [(String, AttrLit)],
}

/// Renders a literal as it would be written in the text format.
pub(crate) fn show(v: &AttrLit) -> String {
    match v {
        AttrLit::None => "None".to_string(),
        AttrLit::Bool(true) => "True".to_string(),
        AttrLit::Bool(false) => "False".to_string(),
        AttrLit::Int(i) => i.to_string(),
        AttrLit::Float(f) => format!("{f:?}"),
        AttrLit::Str(s) => format!("{s:?}"),
        AttrLit::List(items) => {
            let parts: Vec<String> = items.iter().map(show).collect();
            format!("[{}]", parts.join(", "))
        }
        AttrLit::IndexMap(m) => format!("T.index_map({m})"),
    }
}

impl<'a> Kwargs<'a> {
    /// Checks that every keyword is one of `names` and appears once.
    pub(crate) fn new(
        op: &'a str,
        names: &[&str],
        kw: &'a [(String, AttrLit)],
    ) -> Result<Self, String> {
        for (i, (k, _)) in kw.iter().enumerate() {
            if !names.contains(&k.as_str()) {
                let valid = if names.is_empty() {
                    "it takes no attributes".to_string()
                } else {
                    format!("valid attributes: {}", names.join(", "))
                };
                return Err(format!("`{op}` has no attribute `{k}`; {valid}"));
            }
            if kw.iter().take(i).any(|(prev, _)| prev == k) {
                return Err(format!("`{op}`: attribute `{k}` is given twice"));
            }
        }
        Ok(Kwargs { op, kw })
    }

    fn get(&self, k: &str) -> Option<&'a AttrLit> {
        self.kw.iter().find(|(n, _)| n == k).map(|(_, v)| v)
    }

    fn err(&self, k: &str, expected: &str, found: &AttrLit) -> String {
        format!(
            "`{}` attribute `{k}`: expected {expected}, found {}",
            self.op,
            show(found)
        )
    }

    fn missing(&self, k: &str) -> String {
        format!("`{}`: missing required attribute `{k}`", self.op)
    }

    /// Looks up `k`, falling back to `default`, or fails when it is required.
    fn lookup<T>(
        &self,
        k: &str,
        default: Option<T>,
        read: impl FnOnce(&AttrLit) -> Option<T>,
        expected: &str,
    ) -> Result<T, String> {
        match self.get(k) {
            None => default.ok_or_else(|| self.missing(k)),
            Some(v) => read(v).ok_or_else(|| self.err(k, expected, v)),
        }
    }

    /// An integer.
    pub(crate) fn int(&self, k: &str, default: Option<i64>) -> Result<i64, String> {
        self.lookup(k, default, lit_int, "an integer")
    }

    /// An integer or `None`.
    pub(crate) fn opt_int(&self, k: &str, default: Option<i64>) -> Result<Option<i64>, String> {
        match self.get(k) {
            None => Ok(default),
            Some(AttrLit::None) => Ok(None),
            Some(v) => lit_int(v)
                .map(Some)
                .ok_or_else(|| self.err(k, "an integer or None", v)),
        }
    }

    /// A list (or tuple) of integers; a bare integer is a list of one.
    pub(crate) fn ints(&self, k: &str, default: Option<&[i64]>) -> Result<Vec<i64>, String> {
        self.lookup(
            k,
            default.map(<[i64]>::to_vec),
            lit_ints,
            "a list of integers",
        )
    }

    /// A list of integers or `None`.
    pub(crate) fn opt_ints(&self, k: &str) -> Result<Option<Vec<i64>>, String> {
        match self.get(k) {
            None | Some(AttrLit::None) => Ok(None),
            Some(v) => lit_ints(v)
                .map(Some)
                .ok_or_else(|| self.err(k, "a list of integers or None", v)),
        }
    }

    /// A float (an integer literal is accepted).
    pub(crate) fn float(&self, k: &str, default: f64) -> Result<F64, String> {
        let read = |v: &AttrLit| match v {
            AttrLit::Float(f) => Some(F64(*f)),
            AttrLit::Int(i) => Some(F64(*i as f64)),
            _ => None,
        };
        self.lookup(k, Some(F64(default)), read, "a float")
    }

    /// A float with no default (an integer literal is accepted).
    pub(crate) fn req_float(&self, k: &str) -> Result<F64, String> {
        match self.get(k) {
            None => Err(self.missing(k)),
            Some(_) => self.float(k, 0.0),
        }
    }

    /// `True` or `False`.
    pub(crate) fn bool(&self, k: &str, default: bool) -> Result<bool, String> {
        let read = |v: &AttrLit| match v {
            AttrLit::Bool(b) => Some(*b),
            _ => None,
        };
        self.lookup(k, Some(default), read, "True or False")
    }

    /// A string.
    pub(crate) fn string(&self, k: &str, default: Option<&str>) -> Result<String, String> {
        let read = |v: &AttrLit| match v {
            AttrLit::Str(s) => Some(s.clone()),
            _ => None,
        };
        self.lookup(k, default.map(str::to_string), read, "a string")
    }

    /// A dtype name, or `None` / `"void"` / `""` for unset.
    pub(crate) fn opt_dtype(&self, k: &str) -> Result<Option<DType>, String> {
        match self.get(k) {
            None | Some(AttrLit::None) => Ok(None),
            Some(AttrLit::Str(s)) if s == "void" || s.is_empty() => Ok(None),
            Some(v) => self.dtype_of(k, v).map(Some),
        }
    }

    /// A required dtype name.
    pub(crate) fn dtype(&self, k: &str) -> Result<DType, String> {
        match self.get(k) {
            None => Err(self.missing(k)),
            Some(v) => self.dtype_of(k, v),
        }
    }

    fn dtype_of(&self, k: &str, v: &AttrLit) -> Result<DType, String> {
        let expected = || {
            let names: Vec<&str> = DType::ALL.iter().map(|d| d.name()).collect();
            format!("a dtype (one of {})", names.join(", "))
        };
        match v {
            AttrLit::Str(s) => DType::from_name(s).ok_or_else(|| self.err(k, &expected(), v)),
            _ => Err(self.err(k, &expected(), v)),
        }
    }

    /// The raw literal, for attributes with their own reader.
    pub(crate) fn raw(&self, k: &str) -> Option<&'a AttrLit> {
        self.get(k)
    }

    /// An error for attribute `k` with value `v`.
    pub(crate) fn error(&self, k: &str, expected: &str, v: &AttrLit) -> String {
        self.err(k, expected, v)
    }

    /// An error about the value of attribute `k` that is well formed but not valid.
    pub(crate) fn invalid(&self, k: &str, why: &str) -> String {
        format!("`{}` attribute `{k}`: {why}", self.op)
    }
}

fn lit_int(v: &AttrLit) -> Option<i64> {
    match v {
        AttrLit::Int(i) => Some(*i),
        _ => None,
    }
}

fn lit_ints(v: &AttrLit) -> Option<Vec<i64>> {
    match v {
        AttrLit::Int(i) => Some(vec![*i]),
        AttrLit::List(items) => items.iter().map(lit_int).collect(),
        _ => None,
    }
}

/// `[a, b, ...]`.
pub(crate) fn ints_lit(v: &[i64]) -> AttrLit {
    AttrLit::List(v.iter().map(|&i| AttrLit::Int(i)).collect())
}

/// `[a, b, ...]` or `None`.
pub(crate) fn opt_ints_lit(v: Option<&[i64]>) -> AttrLit {
    v.map_or(AttrLit::None, ints_lit)
}

/// An integer or `None`.
pub(crate) fn opt_int_lit(v: Option<i64>) -> AttrLit {
    v.map_or(AttrLit::None, AttrLit::Int)
}

/// A dtype name or `None`.
pub(crate) fn dtype_lit(d: Option<DType>) -> AttrLit {
    d.map_or(AttrLit::None, |d| AttrLit::Str(d.name().to_string()))
}

/// A string literal.
pub(crate) fn str_lit(s: &str) -> AttrLit {
    AttrLit::Str(s.to_string())
}

/// Expands 1 or 2 integers to a pair.
pub(crate) fn pair(kw: &Kwargs<'_>, k: &str, v: &[i64]) -> Result<[i64; 2], String> {
    match *v {
        [a] => Ok([a, a]),
        [a, b] => Ok([a, b]),
        _ => Err(kw.invalid(k, &format!("expected 1 or 2 integers, found {}", v.len()))),
    }
}

/// Expands 1, 2 or 4 integers to (top, left, bottom, right).
pub(crate) fn quad(kw: &Kwargs<'_>, k: &str, v: &[i64]) -> Result<[i64; 4], String> {
    match *v {
        [a] => Ok([a, a, a, a]),
        [a, b] => Ok([a, b, a, b]),
        [a, b, c, d] => Ok([a, b, c, d]),
        _ => Err(kw.invalid(
            k,
            &format!("expected 1, 2 or 4 integers, found {}", v.len()),
        )),
    }
}

/// Checks that every value is at least `min`.
pub(crate) fn at_least(kw: &Kwargs<'_>, k: &str, v: &[i64], min: i64) -> Result<(), String> {
    match v.iter().find(|&&x| x < min) {
        Some(x) => Err(kw.invalid(k, &format!("every value must be at least {min}, found {x}"))),
        None => Ok(()),
    }
}

/// Where each letter of `letters` sits in `layout`, when `layout` is a permutation of it.
pub(crate) fn layout_pos<const N: usize>(layout: &str, letters: &str) -> Option<[usize; N]> {
    let l = layout.as_bytes();
    let want = letters.as_bytes();
    if l.len() != N || want.len() != N {
        return None;
    }
    let mut out = [0usize; N];
    for (slot, c) in out.iter_mut().zip(want) {
        let mut found = l.iter().enumerate().filter(|(_, x)| *x == c);
        let (i, _) = found.next()?;
        if found.next().is_some() {
            return None;
        }
        *slot = i;
    }
    Some(out)
}

/// Checks that `layout` is a permutation of `letters`.
pub(crate) fn check_layout(
    kw: &Kwargs<'_>,
    k: &str,
    layout: &str,
    letters: &str,
) -> Result<(), String> {
    if layout_pos::<4>(layout, letters).is_some() {
        Ok(())
    } else {
        Err(kw.invalid(
            k,
            &format!("expected a permutation of \"{letters}\", found \"{layout}\""),
        ))
    }
}

/// Checks that `layout` is a layout of `letters`, possibly with split axes (`NCHW16c`:
/// [`super::layout::Layout`]).
pub(crate) fn check_split_layout(
    kw: &Kwargs<'_>,
    k: &str,
    layout: &str,
    letters: &str,
) -> Result<(), String> {
    if super::layout::Layout::parse(layout, letters).is_some() {
        Ok(())
    } else {
        Err(kw.invalid(
            k,
            &format!(
                "expected a permutation of \"{letters}\", each axis possibly split by a \
                 sub-axis (\"{letters}16{}\"), found \"{layout}\"",
                letters.as_bytes()[1].to_ascii_lowercase() as char
            ),
        ))
    }
}
