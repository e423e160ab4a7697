//! Data layouts with split axes (TVM's `tir.Layout` strings such as `NCHW16c` and
//! `OIHW16i16o`) and the index maps of `R.layout_transform` that move a tensor between two
//! of them.
//!
//! Contract:
//!
//! - A [`Layout`] string names each axis of a tensor in order: an upper-case letter is a
//!   *primal* axis (`C`), a number followed by the lower-case letter is a *sub-axis* of that
//!   primal axis holding `factor` consecutive indices (`16c`). The logical index along `C` is
//!   `C * 16 + c` (TVM's convention). Each primal letter of the op's alphabet (`NCHW`, `OIHW`)
//!   appears once, each sub-axis at most once and only with its primal, factors are at least
//!   one; anything else does not parse ([`Layout::parse`] gives `None`).
//! - [`Layout::logical`] gives the logical extents (in the alphabet's order) of a tensor held
//!   in the layout, checking that each sub-axis has its factor's extent; [`Layout::physical`]
//!   gives the shape of a logical one in the layout, checking that each split extent is a
//!   static multiple of its factor (no padding).
//! - An [`IndexMap`] is TVM's `T.index_map(lambda i0, i1, ...: (...))` restricted to what moves
//!   whole elements between such layouts: each result is an input index `i`, its quotient
//!   `i // k`, its remainder `i % k`, or a fused pair `i * k + j`. Every input index is used
//!   exactly once whole, or exactly once as `i // k` together with `i % k` (the same `k`), so
//!   the map is a bijection once extents agree ([`IndexMap::validate`]); the maps between two
//!   layouts ([`IndexMap::between`]) are of this form.
//! - An index map is a reshape, an axis permutation and a reshape ([`IndexMap::as_permute`]),
//!   which is how the CPU backend runs it.
//!
//! ```text
//! ; NCHW to NCHW16c and back
//! y: R.Tensor((1, 4, 14, 14, 16), dtype="float32") = R.layout_transform(x,
//!     index_map=T.index_map(lambda i0, i1, i2, i3: (i0, i1 // 16, i2, i3, i1 % 16)),
//!     pad_value=None)
//! z: R.Tensor((1, 64, 14, 14), dtype="float32") = R.layout_transform(y,
//!     index_map=T.index_map(lambda i0, i1, i2, i3, i4: (i0, i1 * 16 + i4, i2, i3)),
//!     pad_value=None)
//! ```

use crate::ir::Dim;
use std::fmt;

/// One axis of a [`Layout`]: an upper-case primal letter, with the factor of the sub-axis
/// when it is one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LayoutAxis {
    /// The primal letter, upper case (`C` for both `C` and `16c`).
    pub letter: u8,
    /// `Some(k)` for the sub-axis `kc`.
    pub factor: Option<i64>,
}

/// A parsed layout string (see the module doc).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Layout {
    axes: Vec<LayoutAxis>,
}

/// The largest sub-axis factor a layout may name.
pub const MAX_FACTOR: i64 = 1 << 20;

impl Layout {
    /// Parses `s` over the primal letters `alphabet` (`"NCHW"`); `None` when it is not a layout
    /// of them (see the module doc).
    pub fn parse(s: &str, alphabet: &str) -> Option<Layout> {
        let mut axes = Vec::new();
        let b = s.as_bytes();
        let mut i = 0;
        while i < b.len() {
            let start = i;
            while i < b.len() && b[i].is_ascii_digit() {
                i += 1;
            }
            let c = *b.get(i)?;
            i += 1;
            if start == i - 1 {
                if !c.is_ascii_uppercase() {
                    return None;
                }
                axes.push(LayoutAxis {
                    letter: c,
                    factor: None,
                });
            } else {
                let k: i64 = s[start..i - 1].parse().ok()?;
                if !c.is_ascii_lowercase() || !(1..=MAX_FACTOR).contains(&k) {
                    return None;
                }
                axes.push(LayoutAxis {
                    letter: c.to_ascii_uppercase(),
                    factor: Some(k),
                });
            }
        }
        let l = Layout { axes };
        for &a in alphabet.as_bytes() {
            let primal = l
                .axes
                .iter()
                .filter(|x| x.letter == a && x.factor.is_none());
            let sub = l
                .axes
                .iter()
                .filter(|x| x.letter == a && x.factor.is_some());
            if primal.count() != 1 || sub.count() > 1 {
                return None;
            }
        }
        let known = l
            .axes
            .iter()
            .all(|x| alphabet.as_bytes().contains(&x.letter));
        (known && l.axes.len() <= 2 * alphabet.len()).then_some(l)
    }

    /// The axes in order.
    pub fn axes(&self) -> &[LayoutAxis] {
        &self.axes
    }

    /// The number of axes (the rank of a tensor held in this layout).
    pub fn rank(&self) -> usize {
        self.axes.len()
    }

    /// Whether no axis is split (the layout is a permutation of its alphabet).
    pub fn is_plain(&self) -> bool {
        self.axes.iter().all(|a| a.factor.is_none())
    }

    /// Where the primal axis `letter` sits.
    pub fn primal(&self, letter: u8) -> Option<usize> {
        self.axes
            .iter()
            .position(|a| a.letter == letter && a.factor.is_none())
    }

    /// Where the sub-axis of `letter` sits and its factor.
    pub fn sub(&self, letter: u8) -> Option<(usize, i64)> {
        self.axes
            .iter()
            .enumerate()
            .find_map(|(i, a)| (a.letter == letter).then_some(i).zip(a.factor))
    }

    /// The logical extents, in `alphabet`'s order, of a tensor with `dims` held in this layout
    /// (the layout's alphabet must be `alphabet`). Errors say which axis does not fit.
    pub fn logical(&self, dims: &[Dim], alphabet: &str) -> Result<Vec<Dim>, String> {
        if dims.len() != self.rank() {
            return Err(format!(
                "layout \"{self}\" has {} axes, found a tensor of rank {}",
                self.rank(),
                dims.len()
            ));
        }
        let mut out = Vec::with_capacity(alphabet.len());
        for &a in alphabet.as_bytes() {
            let p = self
                .primal(a)
                .ok_or_else(|| format!("layout \"{self}\" has no axis {}", a as char))?;
            let d = dims[p].clone();
            out.push(match self.sub(a) {
                None => d,
                Some((q, k)) => {
                    match dims[q].as_static() {
                        Some(e) if e == k => {}
                        _ => {
                            return Err(format!(
                                "axis {q} of layout \"{self}\" ({k}{}) must have extent {k}, found {}",
                                a.to_ascii_lowercase() as char,
                                dims[q]
                            ));
                        }
                    }
                    d.mul(&Dim::Static(k))
                }
            });
        }
        Ok(out)
    }

    /// The shape, in this layout, of a tensor with the logical extents `logical` (in
    /// `alphabet`'s order). A split extent must be a static multiple of its factor.
    pub fn physical(&self, logical: &[Dim], alphabet: &str) -> Result<Vec<Dim>, String> {
        let ext = |letter: u8| {
            alphabet
                .bytes()
                .position(|a| a == letter)
                .and_then(|i| logical.get(i))
                .cloned()
                .ok_or_else(|| format!("layout \"{self}\": no extent for axis {}", letter as char))
        };
        let mut out = Vec::with_capacity(self.rank());
        for a in &self.axes {
            let d = ext(a.letter)?;
            out.push(match (a.factor, self.sub(a.letter)) {
                (Some(k), _) => Dim::Static(k),
                (None, None) => d,
                (None, Some((_, k))) => match d.as_static() {
                    Some(v) if v % k == 0 => Dim::Static(v / k),
                    _ => {
                        return Err(format!(
                            "layout \"{self}\" splits axis {} by {k}: its extent must be a \
                             multiple of {k}, found {d}",
                            a.letter as char
                        ));
                    }
                },
            });
        }
        Ok(out)
    }
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for a in &self.axes {
            match a.factor {
                None => write!(f, "{}", a.letter as char)?,
                Some(k) => write!(f, "{k}{}", a.letter.to_ascii_lowercase() as char)?,
            }
        }
        Ok(())
    }
}

/// One result of an [`IndexMap`]: an expression of the input indices.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MapExpr {
    /// `i`.
    Var(usize),
    /// `i // k`.
    Div(usize, i64),
    /// `i % k`.
    Mod(usize, i64),
    /// `i * k + j`.
    Fuse(usize, i64, usize),
}

/// The index map of `R.layout_transform` (see the module doc).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct IndexMap {
    /// The number of input indices (the input's rank).
    pub inputs: usize,
    /// One expression per output axis.
    pub outputs: Vec<MapExpr>,
}

/// An [`IndexMap`] on a tensor of static shape as a reshape, a permutation and a reshape
/// ([`IndexMap::as_permute`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Permute {
    /// The input's extents with each split axis `d` as `(d / k, k)`.
    pub split: Vec<usize>,
    /// The permutation of those parts that gives the output's parts in order.
    pub perm: Vec<usize>,
    /// The output's shape.
    pub out: Vec<usize>,
}

/// How an input index is used by a valid map.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Use {
    Whole,
    Split(i64),
}

impl IndexMap {
    /// Checks that the map is of the supported form: every input index used exactly once
    /// whole, or as `i // k` and `i % k` with one `k` (at least 1).
    pub fn validate(&self) -> Result<(), String> {
        self.uses().map(|_| ())
    }

    /// How each input index is used, checking the map's form ([`IndexMap::validate`]).
    fn uses(&self) -> Result<Vec<Use>, String> {
        let mut whole = vec![0usize; self.inputs];
        let mut div = vec![Vec::new(); self.inputs];
        let mut rem = vec![Vec::new(); self.inputs];
        let bad = |i: usize| -> String {
            format!("index i{i} is outside the map's {} inputs", self.inputs)
        };
        for e in &self.outputs {
            match *e {
                MapExpr::Var(i) => *whole.get_mut(i).ok_or_else(|| bad(i))? += 1,
                MapExpr::Div(i, k) => div.get_mut(i).ok_or_else(|| bad(i))?.push(k),
                MapExpr::Mod(i, k) => rem.get_mut(i).ok_or_else(|| bad(i))?.push(k),
                MapExpr::Fuse(i, _, j) => {
                    *whole.get_mut(i).ok_or_else(|| bad(i))? += 1;
                    *whole.get_mut(j).ok_or_else(|| bad(j))? += 1;
                }
            }
            if let MapExpr::Div(_, k) | MapExpr::Mod(_, k) | MapExpr::Fuse(_, k, _) = *e
                && !(1..=MAX_FACTOR).contains(&k)
            {
                return Err(format!("the factor {k} must be between 1 and {MAX_FACTOR}"));
            }
            if let MapExpr::Fuse(i, _, j) = *e
                && i == j
            {
                return Err(format!("`i{i} * k + i{i}` fuses an index with itself"));
            }
        }
        (0..self.inputs)
            .map(|i| match (whole[i], div[i].as_slice(), rem[i].as_slice()) {
                (1, [], []) => Ok(Use::Whole),
                (0, [k], [m]) if k == m => Ok(Use::Split(*k)),
                _ => Err(format!(
                    "index i{i} must appear exactly once, or as `i{i} // k` and `i{i} % k` with \
                     one k (the map must move whole elements)"
                )),
            })
            .collect()
    }

    /// The output shape for an input of extents `dims`: errors when the input's rank is not
    /// the map's, a split extent is not a static multiple of its factor, or a fused inner
    /// index's extent is not the factor.
    pub fn out_dims(&self, dims: &[Dim]) -> Result<Vec<Dim>, String> {
        self.validate()?;
        if dims.len() != self.inputs {
            return Err(format!(
                "the index map takes {} indices, found a tensor of rank {}",
                self.inputs,
                dims.len()
            ));
        }
        self.outputs
            .iter()
            .map(|e| match *e {
                MapExpr::Var(i) => Ok(dims[i].clone()),
                MapExpr::Div(i, k) => match dims[i].as_static() {
                    Some(v) if v % k == 0 => Ok(Dim::Static(v / k)),
                    _ => Err(format!(
                        "`i{i} // {k}` needs axis {i}'s extent to be a multiple of {k} (padding \
                         is not supported), found {}",
                        dims[i]
                    )),
                },
                MapExpr::Mod(_, k) => Ok(Dim::Static(k)),
                MapExpr::Fuse(i, k, j) => match dims[j].as_static() {
                    Some(v) if v == k => Ok(dims[i].mul(&Dim::Static(k))),
                    _ => Err(format!(
                        "`i{i} * {k} + i{j}` needs axis {j}'s extent to be {k}, found {}",
                        dims[j]
                    )),
                },
            })
            .collect()
    }

    /// The map as `reshape(x, split) → permute_dims(axes) → reshape(out)`: the input's extents
    /// with each split axis `d` as `(d / k, k)`, the permutation of those parts that gives the
    /// output's parts in order (a fused output axis is two consecutive parts), and the output's
    /// shape. `dims` are the input's static extents; errors as [`IndexMap::out_dims`].
    pub fn as_permute(&self, dims: &[usize]) -> Result<Permute, String> {
        let as_dims: Vec<Dim> = dims
            .iter()
            .map(|&d| Dim::Static(i64::try_from(d).unwrap_or(i64::MAX)))
            .collect();
        let out = self
            .out_dims(&as_dims)?
            .iter()
            .map(|d| d.as_static().and_then(|v| usize::try_from(v).ok()))
            .collect::<Option<Vec<usize>>>()
            .ok_or("the index map gives a shape out of range")?;
        let uses = self.uses()?;
        // First part of each input index, in the split shape.
        let mut first = Vec::with_capacity(self.inputs);
        let mut split = Vec::new();
        for (i, u) in uses.iter().enumerate() {
            first.push(split.len());
            match *u {
                Use::Whole => split.push(dims[i]),
                Use::Split(k) => {
                    let k = usize::try_from(k).map_err(|_| "negative factor".to_string())?;
                    split.push(dims[i] / k);
                    split.push(k);
                }
            }
        }
        let mut perm = Vec::with_capacity(split.len());
        for e in &self.outputs {
            match *e {
                MapExpr::Var(i) | MapExpr::Div(i, _) => perm.push(first[i]),
                MapExpr::Mod(i, _) => perm.push(first[i] + 1),
                MapExpr::Fuse(i, _, j) => {
                    perm.push(first[i]);
                    perm.push(first[j]);
                }
            }
        }
        Ok(Permute { split, perm, out })
    }

    /// The map taking a tensor held in layout `from` to layout `to` (layouts of one
    /// alphabet). Errors when a primal axis is split by different factors in the two.
    pub fn between(from: &Layout, to: &Layout) -> Result<IndexMap, String> {
        let mut outputs = Vec::with_capacity(to.rank());
        for a in to.axes() {
            let src_primal = from
                .primal(a.letter)
                .ok_or_else(|| format!("layout \"{from}\" has no axis {}", a.letter as char))?;
            let src_sub = from.sub(a.letter);
            let dst_sub = to.sub(a.letter).map(|(_, k)| k);
            let e = match (a.factor, src_sub, dst_sub) {
                // A whole axis from a whole axis.
                (None, None, None) => MapExpr::Var(src_primal),
                // Fused back from a split one.
                (None, Some((q, k)), None) => MapExpr::Fuse(src_primal, k, q),
                // Split from a whole one.
                (None, None, Some(k)) => MapExpr::Div(src_primal, k),
                (Some(k), None, _) => MapExpr::Mod(src_primal, k),
                // Split in both by the same factor: the parts move.
                (None, Some((_, k)), Some(g)) if k == g => MapExpr::Var(src_primal),
                (Some(g), Some((q, k)), _) if k == g => MapExpr::Var(q),
                _ => {
                    return Err(format!(
                        "cannot transform \"{from}\" to \"{to}\": axis {} is split by different \
                         factors",
                        a.letter as char
                    ));
                }
            };
            outputs.push(e);
        }
        let m = IndexMap {
            inputs: from.rank(),
            outputs,
        };
        m.validate()?;
        Ok(m)
    }

    /// Parses the text of a lambda, `lambda a, b, c: (a, b // 16, c, b % 16)` (the inside of
    /// `T.index_map(...)`), or the same without the parentheses around a single result.
    pub fn parse(src: &str) -> Result<IndexMap, String> {
        let toks = map_tokens(src)?;
        let mut p = MapParser { toks, i: 0 };
        p.keyword("lambda")?;
        let mut names: Vec<String> = Vec::new();
        loop {
            let n = p.ident("an index name")?;
            if names.contains(&n) {
                return Err(format!("the index name `{n}` is given twice"));
            }
            names.push(n);
            if p.eat(":") {
                break;
            }
            p.expect(",")?;
        }
        let paren = p.eat("(");
        let mut outputs = Vec::new();
        loop {
            if paren && p.eat(")") {
                break;
            }
            outputs.push(p.expr(&names)?);
            if !p.eat(",") {
                if paren {
                    p.expect(")")?;
                }
                break;
            }
        }
        if let Some(t) = p.toks.get(p.i) {
            return Err(format!("unexpected `{t}` after the index map's results"));
        }
        let m = IndexMap {
            inputs: names.len(),
            outputs,
        };
        m.validate()?;
        Ok(m)
    }
}

impl fmt::Display for IndexMap {
    /// `lambda i0, i1, ...: (...)`, as TVM prints it inside `T.index_map(...)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("lambda ")?;
        for i in 0..self.inputs {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "i{i}")?;
        }
        f.write_str(": (")?;
        for (n, e) in self.outputs.iter().enumerate() {
            if n > 0 {
                f.write_str(", ")?;
            }
            match *e {
                MapExpr::Var(i) => write!(f, "i{i}")?,
                MapExpr::Div(i, k) => write!(f, "i{i} // {k}")?,
                MapExpr::Mod(i, k) => write!(f, "i{i} % {k}")?,
                MapExpr::Fuse(i, k, j) => write!(f, "i{i} * {k} + i{j}")?,
            }
        }
        if self.outputs.len() == 1 {
            f.write_str(",")?;
        }
        f.write_str(")")
    }
}

/// Splits a lambda's text into tokens: names, integers and the punctuation it may hold.
fn map_tokens(src: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    let b = src.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c.is_ascii_whitespace() {
            i += 1;
        } else if c.is_ascii_alphanumeric() || c == b'_' {
            let s = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
            out.push(src[s..i].to_string());
        } else if src[i..].starts_with("//") {
            out.push("//".into());
            i += 2;
        } else if b"(),:%*+".contains(&c) {
            out.push((c as char).to_string());
            i += 1;
        } else {
            let ch = src[i..].chars().next().unwrap_or('?');
            return Err(format!(
                "unexpected `{ch}` in the index map at byte {i} (expected names, integers and \
                 `//`, `%`, `*`, `+`)"
            ));
        }
        if out.len() > 4096 {
            return Err("the index map is too long".into());
        }
    }
    Ok(out)
}

struct MapParser {
    toks: Vec<String>,
    i: usize,
}

impl MapParser {
    fn peek(&self) -> Option<&str> {
        self.toks.get(self.i).map(String::as_str)
    }

    fn found(&self) -> String {
        self.peek()
            .map_or_else(|| "the end".to_string(), |t| format!("`{t}`"))
    }

    fn eat(&mut self, t: &str) -> bool {
        let hit = self.peek() == Some(t);
        self.i += usize::from(hit);
        hit
    }

    fn expect(&mut self, t: &str) -> Result<(), String> {
        if self.eat(t) {
            Ok(())
        } else {
            Err(format!(
                "expected `{t}` in the index map, found {}",
                self.found()
            ))
        }
    }

    fn keyword(&mut self, k: &str) -> Result<(), String> {
        self.expect(k)
    }

    fn ident(&mut self, what: &str) -> Result<String, String> {
        match self.peek() {
            Some(t) if t.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_') => {
                let t = t.to_string();
                self.i += 1;
                Ok(t)
            }
            _ => Err(format!(
                "expected {what} in the index map, found {}",
                self.found()
            )),
        }
    }

    fn var(&mut self, names: &[String]) -> Result<usize, String> {
        let n = self.ident("an index name")?;
        names.iter().position(|x| *x == n).ok_or_else(|| {
            format!(
                "`{n}` is not one of the lambda's indices ({})",
                names.join(", ")
            )
        })
    }

    fn int(&mut self) -> Result<i64, String> {
        let t = self.peek().unwrap_or("");
        let v = t.parse::<i64>().map_err(|_| {
            format!(
                "expected a positive integer in the index map, found {}",
                self.found()
            )
        })?;
        self.i += 1;
        Ok(v)
    }

    fn expr(&mut self, names: &[String]) -> Result<MapExpr, String> {
        let i = self.var(names)?;
        Ok(if self.eat("//") {
            MapExpr::Div(i, self.int()?)
        } else if self.eat("%") {
            MapExpr::Mod(i, self.int()?)
        } else if self.eat("*") {
            let k = self.int()?;
            self.expect("+")?;
            MapExpr::Fuse(i, k, self.var(names)?)
        } else {
            MapExpr::Var(i)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[i64]) -> Vec<Dim> {
        v.iter().map(|&x| Dim::Static(x)).collect()
    }

    #[test]
    fn layouts_parse_and_give_extents() {
        let l = Layout::parse("NCHW16c", "NCHW").unwrap();
        assert_eq!(l.rank(), 5);
        assert_eq!(l.to_string(), "NCHW16c");
        assert_eq!(l.sub(b'C'), Some((4, 16)));
        assert_eq!(
            l.logical(&s(&[1, 4, 7, 7, 16]), "NCHW").unwrap(),
            s(&[1, 64, 7, 7])
        );
        assert_eq!(
            l.physical(&s(&[1, 64, 7, 7]), "NCHW").unwrap(),
            s(&[1, 4, 7, 7, 16])
        );
        let e = l.physical(&s(&[1, 40, 7, 7]), "NCHW").unwrap_err();
        assert!(e.contains("multiple of 16"), "{e}");
        let e = l.logical(&s(&[1, 4, 7, 7, 8]), "NCHW").unwrap_err();
        assert!(e.contains("must have extent 16"), "{e}");
        let k = Layout::parse("OIHW16i16o", "OIHW").unwrap();
        assert_eq!(
            k.logical(&s(&[2, 3, 1, 1, 16, 16]), "OIHW").unwrap(),
            s(&[32, 48, 1, 1])
        );
        for bad in [
            "NCHW16",
            "NCH",
            "NCHW16c8c",
            "NCHWc",
            "NCHW0c",
            "NCHW16x",
            "NCCHW",
            "nchw",
            "NCHW99999999999999999999c",
        ] {
            assert!(Layout::parse(bad, "NCHW").is_none(), "{bad}");
        }
        assert!(Layout::parse("NHWC", "NCHW").unwrap().is_plain());
    }

    use proptest::strategy::Strategy as _;

    proptest::proptest! {
        /// For any two layouts of `NCHW` splitting the same axis by the same factor (or one
        /// not splitting it), the map between them prints and parses back to itself, gives
        /// the target layout's shape, and composes with the map back to the identity shape.
        #[test]
        fn maps_between_layouts_agree_with_their_shapes(
            oa in proptest::strategy::Just(vec![b'N', b'C', b'H', b'W']).prop_shuffle(),
            ob in proptest::strategy::Just(vec![b'N', b'C', b'H', b'W']).prop_shuffle(),
            axis in 0usize..4,
            k in proptest::sample::select(vec![2i64, 4, 16]),
            split_a in proptest::bool::ANY,
            outer in proptest::array::uniform4(1i64..5),
        ) {
            let letter = b"NCHW"[axis];
            let name = |o: &[u8], split: bool| {
                let mut s: String = o.iter().map(|&c| c as char).collect();
                if split {
                    s.push_str(&format!("{k}{}", letter.to_ascii_lowercase() as char));
                }
                s
            };
            let a = Layout::parse(&name(&oa, split_a), "NCHW").unwrap();
            let b = Layout::parse(&name(&ob, true), "NCHW").unwrap();
            let mut logical = outer;
            logical[axis] *= k;
            let logical: Vec<Dim> = logical.iter().map(|&v| Dim::Static(v)).collect();
            let (pa, pb) = (a.physical(&logical, "NCHW").unwrap(), b.physical(&logical, "NCHW").unwrap());
            let m = IndexMap::between(&a, &b).unwrap();
            proptest::prop_assert_eq!(IndexMap::parse(&m.to_string()).unwrap(), m.clone());
            proptest::prop_assert_eq!(m.out_dims(&pa).unwrap(), pb.clone());
            let back = IndexMap::between(&b, &a).unwrap();
            proptest::prop_assert_eq!(back.out_dims(&pb).unwrap(), pa);
            proptest::prop_assert_eq!(b.logical(&pb, "NCHW").unwrap(), logical);
        }
    }

    #[test]
    fn maps_parse_print_and_invert() {
        let m = IndexMap::parse("lambda n, c, h, w: (n, c // 16, h, w, c % 16)").unwrap();
        assert_eq!(
            m.to_string(),
            "lambda i0, i1, i2, i3: (i0, i1 // 16, i2, i3, i1 % 16)"
        );
        assert_eq!(IndexMap::parse(&m.to_string()).unwrap(), m);
        let from = Layout::parse("NCHW", "NCHW").unwrap();
        let to = Layout::parse("NCHW16c", "NCHW").unwrap();
        assert_eq!(IndexMap::between(&from, &to).unwrap(), m);
        let back = IndexMap::between(&to, &from).unwrap();
        assert_eq!(
            back.to_string(),
            "lambda i0, i1, i2, i3, i4: (i0, i1 * 16 + i4, i2, i3)"
        );
        assert_eq!(
            m.out_dims(&s(&[1, 64, 7, 7])).unwrap(),
            s(&[1, 4, 7, 7, 16])
        );
        assert_eq!(
            back.out_dims(&s(&[1, 4, 7, 7, 16])).unwrap(),
            s(&[1, 64, 7, 7])
        );
        let p = m.as_permute(&[1, 64, 7, 7]).unwrap();
        assert_eq!(
            (p.split, p.perm, p.out),
            (
                vec![1, 4, 16, 7, 7],
                vec![0, 1, 3, 4, 2],
                vec![1, 4, 7, 7, 16]
            )
        );
        let nhwc8 = Layout::parse("NHWC8c", "NCHW").unwrap();
        let m2 = IndexMap::between(&to, &nhwc8);
        assert!(m2.unwrap_err().contains("different factors"));
        for bad in [
            "lambda a, b: (a, a)",
            "lambda a, b: (a // 2, b)",
            "lambda a, b: (a // 2, a % 4, b)",
            "lambda a: (b,)",
            "lambda a, a: (a, a)",
            "lambda a: (a // 0, a % 0)",
            "lambda a, b: (a * 2 + a, b)",
            "lambda a: (a + 1,)",
            "lam a: (a,)",
            "lambda a: (a,) x",
        ] {
            assert!(IndexMap::parse(bad).is_err(), "{bad}");
        }
        let e = m.out_dims(&s(&[1, 60, 7, 7])).unwrap_err();
        assert!(e.contains("multiple of 16"), "{e}");
    }
}
