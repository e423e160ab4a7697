//! Tensor dimensions: static integers, symbolic variables (`n`) and small integer expressions
//! over them (`h - kh + 1`, `(n + 1) // 2`, `T.max(2048 - n, 0)`), as TVM's `PrimExpr` shapes
//! print.
//!
//! Constructors fold constants and the identities `x + 0`, `x * 1`, `x * 0`, `x // 1`,
//! `T.max(x, x)`, so the dims inferred for static shapes stay static.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;

/// The largest extent (and largest constant inside a dim expression) the text format accepts:
/// type inference rejects a result beyond it, so every inferred shape prints back as text the
/// parser reads (2^40: ample for real tensors, far from `i64` overflow in shape arithmetic).
pub const MAX_DIM: i64 = 1 << 40;

/// The most binary operators one dim expression may hold (the text parser's limit too).
pub const MAX_DIM_OPS: usize = 256;

/// A symbolic dimension variable (`n = T.int64()` in the text format).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Sym(pub Arc<str>);

impl Sym {
    /// A symbol with this name.
    pub fn new(name: &str) -> Self {
        Sym(Arc::from(name))
    }

    /// The name.
    pub fn name(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Sym {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A binary operator in a dimension expression.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DimOp {
    /// `a + b`
    Add,
    /// `a - b`
    Sub,
    /// `a * b`
    Mul,
    /// `a // b` (floor division)
    FloorDiv,
    /// `a % b` (floor modulo)
    FloorMod,
    /// `T.max(a, b)`
    Max,
    /// `T.min(a, b)`
    Min,
}

impl DimOp {
    /// The infix operator, or the function name (`T.max`) of the two written as calls.
    fn symbol(self) -> &'static str {
        match self {
            DimOp::Add => "+",
            DimOp::Sub => "-",
            DimOp::Mul => "*",
            DimOp::FloorDiv => "//",
            DimOp::FloorMod => "%",
            DimOp::Max => "T.max",
            DimOp::Min => "T.min",
        }
    }

    /// Binding strength of an infix operator; `None` for the two written as calls.
    fn precedence(self) -> Option<u8> {
        match self {
            DimOp::Add | DimOp::Sub => Some(1),
            DimOp::Mul | DimOp::FloorDiv | DimOp::FloorMod => Some(2),
            DimOp::Max | DimOp::Min => None,
        }
    }

    fn apply(self, a: i64, b: i64) -> Option<i64> {
        match self {
            DimOp::Add => a.checked_add(b),
            DimOp::Sub => a.checked_sub(b),
            DimOp::Mul => a.checked_mul(b),
            DimOp::FloorDiv => (b != 0).then(|| a.div_euclid(b)),
            DimOp::FloorMod => (b != 0).then(|| a.rem_euclid(b)),
            DimOp::Max => Some(a.max(b)),
            DimOp::Min => Some(a.min(b)),
        }
    }
}

/// One dimension of a shape.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dim {
    /// A known extent.
    Static(i64),
    /// A symbolic variable.
    Sym(Sym),
    /// An expression over symbols and integers.
    Expr(Arc<(DimOp, Dim, Dim)>),
}

impl Dim {
    /// A symbolic dim named `name`.
    pub fn sym(name: &str) -> Dim {
        Dim::Sym(Sym::new(name))
    }

    /// The static extent, if known.
    pub fn as_static(&self) -> Option<i64> {
        match self {
            Dim::Static(v) => Some(*v),
            _ => None,
        }
    }

    /// Combines two dims with `op`, folding constants and trivial identities.
    pub fn binary(op: DimOp, a: Dim, b: Dim) -> Dim {
        if let (Dim::Static(x), Dim::Static(y)) = (&a, &b)
            && let Some(v) = op.apply(*x, *y)
        {
            return Dim::Static(v);
        }
        match (op, a.as_static(), b.as_static()) {
            (DimOp::Add, Some(0), _) => return b,
            (DimOp::Add | DimOp::Sub, _, Some(0)) => return a,
            (DimOp::Mul, Some(1), _) => return b,
            (DimOp::Mul | DimOp::FloorDiv, _, Some(1)) => return a,
            (DimOp::Mul, Some(0), _) | (DimOp::Mul, _, Some(0)) => return Dim::Static(0),
            (DimOp::Sub, _, _) if a == b => return Dim::Static(0),
            (DimOp::Max | DimOp::Min, _, _) if a == b => return a,
            _ => {}
        }
        // `(x * k) // c` with `c` dividing `k` is `x * (k / c)` (Swin's `batch * 16 // 16`).
        if let (DimOp::FloorDiv, Dim::Expr(inner), Some(c)) = (op, &a, b.as_static())
            && c > 0
            && inner.0 == DimOp::Mul
        {
            let (_, p, q) = &**inner;
            let split = match (p.as_static(), q.as_static()) {
                (_, Some(k)) => Some((p, k)),
                (Some(k), _) => Some((q, k)),
                _ => None,
            };
            if let Some((x, k)) = split {
                if k % c == 0 {
                    return x.mul(&Dim::Static(k / c));
                }
                // `(x * k) // c` with a positive `k` dividing `c` is `x // (c / k)`.
                if k > 0 && c % k == 0 {
                    return x.floor_div(&Dim::Static(c / k));
                }
            }
        }
        // `(x * k) % c` with `c` dividing `k` is 0.
        if let (DimOp::FloorMod, Dim::Expr(inner), Some(c)) = (op, &a, b.as_static())
            && c > 0
            && inner.0 == DimOp::Mul
            && [&inner.1, &inner.2]
                .iter()
                .any(|f| f.as_static().is_some_and(|k| k % c == 0))
        {
            return Dim::Static(0);
        }
        // `x + (k - x % k) % k`, `x` rounded up to a multiple of `k` (what `F.pad` to a whole
        // number of blocks exports: LongT5, Mamba2), is `((x + (k - 1)) // k) * k`, so that
        // its quotient by `k` and that quotient times `k` simplify back.
        if op == DimOp::Add {
            for (x, m) in [(&a, &b), (&b, &a)] {
                if let Dim::Expr(e) = m
                    && e.0 == DimOp::FloorMod
                    && let Some(k) = e.2.as_static()
                    && k > 0
                    && !x.has_too_many_ops()
                {
                    let want =
                        Dim::Static(k).sub(&Dim::binary(DimOp::FloorMod, x.clone(), e.2.clone()));
                    if e.1.provably_eq(&want) {
                        return x.add(&Dim::Static(k - 1)).floor_div(&e.2).mul(&e.2);
                    }
                }
            }
        }
        // `c1 - (c2 - x)` is `x + (c1 - c2)` (a slice of the last `max_len - n` of `max_len`),
        // `c1 + (c2 - x)` is `(c1 + c2) - x`.
        if let (DimOp::Add | DimOp::Sub, Some(c1), Dim::Expr(inner)) = (op, a.as_static(), &b)
            && inner.0 == DimOp::Sub
            && let Some(c2) = inner.1.as_static()
        {
            if op == DimOp::Sub
                && let Some(c) = c1.checked_sub(c2)
            {
                return inner.2.add(&Dim::Static(c));
            }
            if op == DimOp::Add
                && let Some(c) = c1.checked_add(c2)
            {
                return Dim::Static(c).sub(&inner.2);
            }
        }
        // `a + T.max(p, q)` is `T.max(a + p, a + q)`, `a - T.max(p, q)` is `T.min(a - p, a - q)`
        // (and so for `T.min`) when `a` is a constant: the extent of a slice that starts at
        // `max(len - n, 0)` is `T.min(n, len)`, which broadcasts against `n`. (Not past
        // MAX_DIM_OPS operators: nested extrema would double the work at each level.)
        if let (DimOp::Add | DimOp::Sub, Some(_), Dim::Expr(inner)) = (op, a.as_static(), &b)
            && matches!(inner.0, DimOp::Max | DimOp::Min)
            && !b.has_too_many_ops()
        {
            let flip = match (op, inner.0) {
                (DimOp::Add, m) => m,
                (_, DimOp::Max) => DimOp::Min,
                _ => DimOp::Max,
            };
            let p = Dim::binary(op, a.clone(), inner.1.clone());
            let q = Dim::binary(op, a.clone(), inner.2.clone());
            return Dim::binary(flip, p, q);
        }
        // `(x + c1) + c2` and `(x - c1) + c2` fold into one constant, as TVM's simplifier does.
        if let (Dim::Expr(inner), Some(c2)) = (&a, b.as_static())
            && matches!(op, DimOp::Add | DimOp::Sub)
        {
            let (iop, x, c1) = &**inner;
            if let (DimOp::Add | DimOp::Sub, Some(c1)) = (iop, c1.as_static()) {
                let c1 = if *iop == DimOp::Add {
                    Some(c1)
                } else {
                    c1.checked_neg()
                };
                let c2 = if op == DimOp::Add {
                    Some(c2)
                } else {
                    c2.checked_neg()
                };
                // Overflow anywhere: leave the expression unfolded.
                if let Some(c) = c1.zip(c2).and_then(|(c1, c2)| c1.checked_add(c2)) {
                    match c {
                        0 => return x.clone(),
                        c if c > 0 => {
                            return Dim::Expr(Arc::new((DimOp::Add, x.clone(), Dim::Static(c))));
                        }
                        c => {
                            if let Some(n) = c.checked_neg() {
                                return Dim::Expr(Arc::new((
                                    DimOp::Sub,
                                    x.clone(),
                                    Dim::Static(n),
                                )));
                            }
                        }
                    }
                }
            }
        }
        Dim::Expr(Arc::new((op, a, b)))
    }

    /// `self + other`.
    pub fn add(&self, other: &Dim) -> Dim {
        Dim::binary(DimOp::Add, self.clone(), other.clone())
    }

    /// `self - other`.
    pub fn sub(&self, other: &Dim) -> Dim {
        Dim::binary(DimOp::Sub, self.clone(), other.clone())
    }

    /// `self * other`.
    pub fn mul(&self, other: &Dim) -> Dim {
        Dim::binary(DimOp::Mul, self.clone(), other.clone())
    }

    /// `self // other`.
    pub fn floor_div(&self, other: &Dim) -> Dim {
        Dim::binary(DimOp::FloorDiv, self.clone(), other.clone())
    }

    /// `T.max(self, other)` (not `Ord::max`, which compares the expressions).
    pub fn maximum(&self, other: &Dim) -> Dim {
        Dim::binary(DimOp::Max, self.clone(), other.clone())
    }

    /// `T.min(self, other)`.
    pub fn minimum(&self, other: &Dim) -> Dim {
        Dim::binary(DimOp::Min, self.clone(), other.clone())
    }

    /// Why this dim has no text form the parser reads back, if it has none: a static extent
    /// or a constant beyond [`MAX_DIM`] in magnitude, an expression over constants only (the
    /// folding overflowed `i64`), or more than [`MAX_DIM_OPS`] operators.
    pub fn out_of_range(&self) -> Option<String> {
        // The walk stops past MAX_DIM_OPS operators: an expression built by doubling a shared
        // subexpression (`d + d`, 80 times over) has 2^80 of them.
        struct Walk {
            ops: usize,
            syms: bool,
            too_long: bool,
            big: Option<i64>,
        }
        fn walk(d: &Dim, w: &mut Walk) {
            match d {
                Dim::Static(v) => {
                    if v.unsigned_abs() > MAX_DIM.unsigned_abs() && w.big.is_none() {
                        w.big = Some(*v);
                    }
                }
                Dim::Sym(_) => w.syms = true,
                Dim::Expr(e) => {
                    w.ops += 1;
                    if w.ops > MAX_DIM_OPS {
                        w.too_long = true;
                        return;
                    }
                    walk(&e.1, w);
                    if !w.too_long {
                        walk(&e.2, w);
                    }
                }
            }
        }
        let mut w = Walk {
            ops: 0,
            syms: false,
            too_long: false,
            big: None,
        };
        walk(self, &mut w);
        if w.too_long {
            return Some(format!(
                "the dim expression has more than {MAX_DIM_OPS} operators"
            ));
        }
        if matches!(self, Dim::Expr(_)) && !w.syms {
            return Some("its arithmetic overflows 64 bits (or divides by zero)".to_string());
        }
        w.big
            .map(|v| format!("{v} is beyond the largest extent {MAX_DIM} (2^40)"))
    }

    /// Whether the expression holds more than [`MAX_DIM_OPS`] operators (counting stops there:
    /// cheap even for a shared subexpression doubled many times over).
    pub fn has_too_many_ops(&self) -> bool {
        fn count(d: &Dim, ops: &mut usize) -> bool {
            if let Dim::Expr(e) = d {
                *ops += 1;
                return *ops > MAX_DIM_OPS || count(&e.1, ops) || count(&e.2, ops);
            }
            false
        }
        count(self, &mut 0)
    }

    /// Adds every symbol in this dim to `out`.
    pub fn collect_syms(&self, out: &mut BTreeSet<Sym>) {
        match self {
            Dim::Static(_) => {}
            Dim::Sym(s) => {
                out.insert(s.clone());
            }
            Dim::Expr(e) => {
                e.1.collect_syms(out);
                e.2.collect_syms(out);
            }
        }
    }

    /// Calls `f` for every symbol in this dim (no allocation).
    pub fn for_each_sym(&self, f: &mut dyn FnMut(&Sym)) {
        match self {
            Dim::Static(_) => {}
            Dim::Sym(s) => f(s),
            Dim::Expr(e) => {
                e.1.for_each_sym(f);
                e.2.for_each_sym(f);
            }
        }
    }

    /// The dim with each symbol that `value` gives replaced by that value, constants folded
    /// ([`Dim::binary`]); other symbols stay.
    pub fn substitute(&self, value: &dyn Fn(&Sym) -> Option<i64>) -> Dim {
        match self {
            Dim::Static(_) => self.clone(),
            Dim::Sym(s) => value(s).map_or_else(|| self.clone(), Dim::Static),
            Dim::Expr(e) => Dim::binary(e.0, e.1.substitute(value), e.2.substitute(value)),
        }
    }

    /// Whether `self` and `other` are equal for every value of their symbols, as far as
    /// polynomial arithmetic shows: both are expanded into sums of products of symbols (a
    /// floor division, modulo, maximum or minimum is one opaque factor), like terms collected, and compared.
    /// `false` means "not shown equal", not "unequal"; expressions past a few hundred terms
    /// are not expanded.
    pub fn provably_eq(&self, other: &Dim) -> bool {
        if self == other {
            return true;
        }
        match (Poly::of(self, &mut 0), Poly::of(other, &mut 0)) {
            (Some(a), Some(b)) => a == b,
            _ => false,
        }
    }

    /// Evaluates the dim with the symbol values given by `lookup`.
    pub fn eval(&self, lookup: &dyn Fn(&Sym) -> Option<i64>) -> Option<i64> {
        match self {
            Dim::Static(v) => Some(*v),
            Dim::Sym(s) => lookup(s),
            Dim::Expr(e) => e.0.apply(e.1.eval(lookup)?, e.2.eval(lookup)?),
        }
    }

    /// Prints with minimal parentheses; past [`MAX_DIM_OPS`] operators (`ops` counts them)
    /// the rest prints as `…` (no parser reads such a dim back, and a shared subexpression
    /// doubled 80 times over would print 2^80 operators).
    fn fmt_prec(
        &self,
        f: &mut fmt::Formatter<'_>,
        parent: u8,
        right: bool,
        ops: &mut usize,
    ) -> fmt::Result {
        match self {
            Dim::Static(v) => write!(f, "{v}"),
            Dim::Sym(s) => write!(f, "{s}"),
            Dim::Expr(_) if *ops >= MAX_DIM_OPS => f.write_str("…"),
            Dim::Expr(e) => {
                *ops += 1;
                let Some(p) = e.0.precedence() else {
                    // A call: its arguments stand alone.
                    write!(f, "{}(", e.0.symbol())?;
                    e.1.fmt_prec(f, 0, false, ops)?;
                    f.write_str(", ")?;
                    e.2.fmt_prec(f, 0, false, ops)?;
                    return f.write_str(")");
                };
                // Left-associative: a right operand of equal precedence needs parentheses.
                let paren = p < parent || (p == parent && right);
                if paren {
                    f.write_str("(")?;
                }
                e.1.fmt_prec(f, p, false, ops)?;
                write!(f, " {} ", e.0.symbol())?;
                e.2.fmt_prec(f, p, true, ops)?;
                if paren {
                    f.write_str(")")?;
                }
                Ok(())
            }
        }
    }
}

/// A dim expanded into a polynomial: each monomial (its factors sorted: symbols and opaque
/// floor divisions / modulos / maxima / minima) with its nonzero integer coefficient.
#[derive(PartialEq, Eq)]
struct Poly(std::collections::BTreeMap<Vec<Dim>, i64>);

impl Poly {
    /// The most monomials an expansion may reach before it gives up.
    const MAX_TERMS: usize = 256;

    /// `d` expanded, `None` past [`MAX_DIM_OPS`] operators (`ops` counts them) or
    /// [`Poly::MAX_TERMS`] monomials.
    fn of(d: &Dim, ops: &mut usize) -> Option<Poly> {
        let mut p = std::collections::BTreeMap::new();
        match d {
            Dim::Static(0) => {}
            Dim::Static(v) => {
                p.insert(Vec::new(), *v);
            }
            Dim::Sym(_) => {
                p.insert(vec![d.clone()], 1);
            }
            Dim::Expr(e) => {
                *ops += 1;
                if *ops > MAX_DIM_OPS {
                    return None;
                }
                return match e.0 {
                    DimOp::Add => Poly::of(&e.1, ops)?.plus(&Poly::of(&e.2, ops)?, 1),
                    DimOp::Sub => Poly::of(&e.1, ops)?.plus(&Poly::of(&e.2, ops)?, -1),
                    DimOp::Mul => Poly::of(&e.1, ops)?.times(&Poly::of(&e.2, ops)?),
                    DimOp::FloorDiv | DimOp::FloorMod => {
                        p.insert(vec![d.clone()], 1);
                        Some(Poly(p))
                    }
                    // Commutative: the operands in one order, so `T.max(a, b)` and
                    // `T.max(b, a)` are the same factor.
                    DimOp::Max | DimOp::Min => {
                        let (a, b) = if e.1 <= e.2 {
                            (&e.1, &e.2)
                        } else {
                            (&e.2, &e.1)
                        };
                        p.insert(vec![Dim::Expr(Arc::new((e.0, a.clone(), b.clone())))], 1);
                        Some(Poly(p))
                    }
                };
            }
        }
        Some(Poly(p))
    }

    /// `self + sign * other`.
    fn plus(mut self, other: &Poly, sign: i64) -> Option<Poly> {
        for (m, c) in &other.0 {
            let add = c.checked_mul(sign)?;
            let e = self.0.entry(m.clone()).or_insert(0);
            *e = e.checked_add(add)?;
            if *e == 0 {
                self.0.remove(m);
            }
        }
        (self.0.len() <= Self::MAX_TERMS).then_some(self)
    }

    fn times(&self, other: &Poly) -> Option<Poly> {
        if self.0.len().checked_mul(other.0.len())? > Self::MAX_TERMS {
            return None;
        }
        let mut out = Poly(std::collections::BTreeMap::new());
        for (ma, ca) in &self.0 {
            for (mb, cb) in &other.0 {
                let mut m: Vec<Dim> = ma.iter().chain(mb).cloned().collect();
                m.sort();
                let mut one = std::collections::BTreeMap::new();
                one.insert(m, ca.checked_mul(*cb)?);
                out = out.plus(&Poly(one), 1)?;
            }
        }
        Some(out)
    }
}

impl From<i64> for Dim {
    fn from(v: i64) -> Self {
        Dim::Static(v)
    }
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.fmt_prec(f, 0, false, &mut 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folds_constants_and_identities() {
        let n = Dim::sym("n");
        assert_eq!(Dim::Static(3).add(&Dim::Static(4)), Dim::Static(7));
        assert_eq!(n.add(&Dim::Static(0)), n);
        assert_eq!(n.mul(&Dim::Static(1)), n);
        assert_eq!(n.sub(&n), Dim::Static(0));
        assert_eq!(
            n.add(&Dim::Static(2)).sub(&Dim::Static(3)).to_string(),
            "n - 1"
        );
    }

    #[test]
    fn a_dim_rounded_up_to_a_block_divides_by_it() {
        // `n + (8 - n % 8) % 8` (F.pad to whole chunks) is `((n + 7) // 8) * 8`, so its
        // quotient by 8 and that quotient times 8 come back to the same expression.
        let n = Dim::sym("n");
        let k = Dim::Static(8);
        let m = Dim::binary(DimOp::FloorMod, n.clone(), k.clone());
        let up = n.add(&Dim::binary(DimOp::FloorMod, k.sub(&m), k.clone()));
        assert_eq!(up.to_string(), "(n + 7) // 8 * 8");
        let q = up.floor_div(&k);
        assert_eq!(q.to_string(), "(n + 7) // 8");
        assert!(q.mul(&k).provably_eq(&up));
        // `(x * 4) // 32` is `x // 8`; `(x * -16) // 16` is `x * -1`; `(x * 16) % 8` is 0.
        assert_eq!(up.mul(&Dim::Static(4)).floor_div(&Dim::Static(32)), q);
        assert_eq!(
            n.mul(&Dim::Static(-16)).floor_div(&Dim::Static(16)),
            n.mul(&Dim::Static(-1))
        );
        assert_eq!(
            Dim::binary(DimOp::FloorMod, n.mul(&Dim::Static(16)), k.clone()),
            Dim::Static(0)
        );
        // The rewrite is the same value for every n.
        for v in -20..40 {
            let at = |d: &Dim| d.eval(&|_| Some(v));
            let want = v + (8 - v.rem_euclid(8)).rem_euclid(8);
            assert_eq!(at(&up), Some(want), "n = {v}");
        }
    }

    #[test]
    fn prints_with_minimal_parentheses() {
        let h = Dim::sym("h");
        let kh = Dim::sym("kh");
        let d = h.mul(&Dim::Static(3)).add(&kh).sub(&Dim::Static(3));
        assert_eq!(d.to_string(), "h * 3 + kh - 3");
        let e = h.add(&Dim::Static(1)).floor_div(&Dim::Static(2));
        assert_eq!(e.to_string(), "(h + 1) // 2");
        let f = h.sub(&kh.sub(&Dim::Static(1)));
        assert_eq!(f.to_string(), "h - (kh - 1)");
    }

    #[test]
    fn exact_quotients_of_products_simplify() {
        let b = Dim::sym("batch");
        assert_eq!(b.mul(&Dim::Static(16)).floor_div(&Dim::Static(16)), b);
        assert_eq!(
            Dim::Static(32)
                .mul(&b)
                .floor_div(&Dim::Static(16))
                .to_string(),
            "batch * 2"
        );
        // Not exact: left as written.
        assert_eq!(
            b.mul(&Dim::Static(6))
                .floor_div(&Dim::Static(4))
                .to_string(),
            "batch * 6 // 4"
        );
        assert_eq!(
            b.add(&Dim::Static(16))
                .floor_div(&Dim::Static(16))
                .to_string(),
            "(batch + 16) // 16"
        );
    }

    #[test]
    fn dims_without_a_text_form_are_out_of_range() {
        assert_eq!(Dim::Static(MAX_DIM).out_of_range(), None);
        assert!(Dim::Static(MAX_DIM + 1).out_of_range().is_some());
        // Folding that overflows leaves an expression over constants only.
        let wrapped = Dim::Static(2).mul(&Dim::Static(1 << 62));
        assert!(matches!(wrapped, Dim::Expr(_)));
        let why = wrapped.out_of_range().unwrap_or_default();
        assert!(why.contains("overflows 64 bits"), "{why}");
        let n = Dim::sym("n");
        assert_eq!(n.add(&Dim::Static(3)).out_of_range(), None);
        assert!(n.mul(&Dim::Static(MAX_DIM + 1)).out_of_range().is_some());
        let long = (0..=MAX_DIM_OPS).fold(n.clone(), |d, _| d.mul(&n));
        let why = long.out_of_range().unwrap_or_default();
        assert!(why.contains("operators"), "{why}");
    }

    #[test]
    fn polynomially_equal_dims_are_provably_equal() {
        let b = Dim::sym("b");
        let s = Dim::sym("s");
        let two = Dim::Static(2);
        // (b + s) * 2 == s * 2 + b * 2
        let l = b.add(&s).mul(&two);
        let r = s.mul(&two).add(&b.mul(&two));
        assert_ne!(l, r);
        assert!(l.provably_eq(&r));
        // b * s - s * b == 0
        assert!(b.mul(&s).sub(&s.mul(&b)).provably_eq(&Dim::Static(0)));
        // Floor division is opaque: (b + 1) // 2 is itself, not b // 2 + 1 // 2.
        let q = b.add(&Dim::Static(1)).floor_div(&two);
        assert!(q.provably_eq(&q.clone()));
        assert!(!q.provably_eq(&b.floor_div(&two)));
        assert!(q.mul(&two).add(&s).provably_eq(&s.add(&two.mul(&q))));
        assert!(!b.provably_eq(&s));
        assert!(!b.add(&Dim::Static(1)).provably_eq(&b));
        // What the exporters' shape arithmetic writes apart: BART's `sequence + -1`
        // against `sequence - 1`, Swin V2's `16 * batch` against `batch * 16`.
        assert!(s.add(&Dim::Static(-1)).provably_eq(&s.sub(&Dim::Static(1))));
        assert!(
            Dim::Static(16)
                .mul(&b)
                .provably_eq(&b.mul(&Dim::Static(16)))
        );
        // A product of many sums would expand past the term limit: not shown equal.
        let sums: Vec<Dim> = (0..12)
            .map(|i| Dim::sym(&format!("x{i}")).add(&Dim::sym(&format!("y{i}"))))
            .collect();
        let big = sums.iter().skip(1).fold(sums[0].clone(), |p, d| p.mul(d));
        assert!(big.provably_eq(&big.clone()));
        assert!(
            !big.provably_eq(
                &big.add(&Dim::Static(0))
                    .mul(&Dim::Static(1))
                    .add(&b)
                    .sub(&b)
            )
        );
    }

    #[test]
    fn doubled_shared_expressions_stay_cheap() {
        // d + d, 100 times over: 2^100 operators as a tree, 100 as shared nodes. Every walk
        // that a user's model can reach stops at MAX_DIM_OPS.
        let n = Dim::sym("n");
        let big = (0..100).fold(n.clone(), |d, _| d.add(&d));
        assert!(big.has_too_many_ops());
        assert!(!n.add(&n).has_too_many_ops());
        let why = big.out_of_range().unwrap_or_default();
        assert!(why.contains("more than 256 operators"), "{why}");
        let text = big.to_string();
        assert!(text.ends_with('…') && text.len() < 4096, "{}", text.len());
        let other = (0..100).fold(n.clone(), |d, _| d.add(&d));
        assert!(!big.provably_eq(&other.add(&Dim::Static(1))));
    }

    #[test]
    fn extrema_print_as_calls_and_distribute_over_constants() {
        let n = Dim::sym("n");
        let c = |v| Dim::Static(v);
        let start = c(2048).sub(&n).maximum(&c(0));
        assert_eq!(start.to_string(), "T.max(2048 - n, 0)");
        // A call never needs parentheses, and its arguments need none of their own.
        assert_eq!(start.mul(&c(2)).to_string(), "T.max(2048 - n, 0) * 2");
        assert_eq!(n.minimum(&c(4).add(&n)).to_string(), "T.min(n, 4 + n)");
        // Static operands fold; equal ones are one.
        assert_eq!(c(3).maximum(&c(7)), c(7));
        assert_eq!(c(3).minimum(&c(7)), c(3));
        assert_eq!(n.maximum(&n), n);
        // `c1 - (c2 - x)` is `x + (c1 - c2)`; a constant minus an extremum distributes.
        assert_eq!(c(10).sub(&c(10).sub(&n)), n);
        assert_eq!(c(2048).sub(&start).to_string(), "T.min(n, 2048)");
        assert_eq!(c(1).add(&start).to_string(), "T.max(2049 - n, 1)");
        // Commutative inside the polynomial comparison.
        let m = Dim::sym("m");
        assert!(n.maximum(&m).provably_eq(&m.maximum(&n)));
        assert!(
            n.maximum(&m)
                .mul(&c(2))
                .provably_eq(&m.maximum(&n).add(&n.maximum(&m)))
        );
        assert!(!n.maximum(&m).provably_eq(&n.minimum(&m)));
        // The rewrites keep the value: checked against the definition on every n in range.
        let len = c(2048).sub(&start);
        for v in -5..3000 {
            let at = |d: &Dim| d.eval(&|_| Some(v));
            assert_eq!(at(&start), Some((2048 - v).max(0)), "n = {v}");
            assert_eq!(at(&len), Some(2048 - (2048 - v).max(0)), "n = {v}");
        }
    }

    /// A dim expression as written, before the constructors simplify it.
    #[derive(Clone, Debug)]
    enum Tree {
        Int(i64),
        Sym(bool),
        Op(DimOp, Box<Tree>, Box<Tree>),
    }

    const OPS: [DimOp; 7] = [
        DimOp::Add,
        DimOp::Sub,
        DimOp::Mul,
        DimOp::FloorDiv,
        DimOp::FloorMod,
        DimOp::Max,
        DimOp::Min,
    ];

    fn tree() -> impl proptest::strategy::Strategy<Value = Tree> {
        use proptest::prelude::*;
        let leaf = prop_oneof![
            (-4i64..300).prop_map(Tree::Int),
            any::<bool>().prop_map(Tree::Sym)
        ];
        leaf.prop_recursive(5, 40, 2, |inner| {
            (0..OPS.len(), inner.clone(), inner)
                .prop_map(|(k, a, b)| Tree::Op(OPS[k], Box::new(a), Box::new(b)))
        })
    }

    impl Tree {
        fn dim(&self) -> Dim {
            match self {
                Tree::Int(v) => Dim::Static(*v),
                Tree::Sym(n) => Dim::sym(if *n { "n" } else { "m" }),
                Tree::Op(op, a, b) => Dim::binary(*op, a.dim(), b.dim()),
            }
        }

        /// The value by plain arithmetic (`None` where it divides by zero or overflows).
        fn eval(&self, n: i64, m: i64) -> Option<i64> {
            match self {
                Tree::Int(v) => Some(*v),
                Tree::Sym(s) => Some(if *s { n } else { m }),
                Tree::Op(op, a, b) => op.apply(a.eval(n, m)?, b.eval(n, m)?),
            }
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config::with_cases(2048))]
        /// The constructors' folding and rewriting (constants, identities, `c1 - (c2 - x)`,
        /// a constant distributed over `T.max` / `T.min`, rounding up to a block) never change
        /// a dim's value, for any values of its symbols, zero and negative ones included.
        #[test]
        fn simplified_dims_keep_their_values(t in tree()) {
            let d = t.dim();
            for (n, m) in (-3i64..12).flat_map(|n| [(n, -2), (n, 0), (n, 1), (n, 5), (n, 33)]) {
                if let Some(want) = t.eval(n, m) {
                    let got = d.eval(&|s: &Sym| Some(if s.name() == "n" { n } else { m }));
                    proptest::prop_assert_eq!(
                        got, Some(want), "{:?} simplified to {} (n = {}, m = {})", t, d, n, m
                    );
                }
            }
        }

        /// A dim prints as text the parser reads back to the same dim (in a shape literal).
        #[test]
        fn dims_print_and_parse_back(t in tree()) {
            let d = t.dim();
            // Types take no negative extents; everything else must read back.
            proptest::prop_assume!(d.out_of_range().is_none() && d.as_static().is_none_or(|v| v >= 0));
            let src = format!(
                "@I.ir_module\nclass Module:\n    @R.function\n    def main(x: R.Tensor((\"n\", \"m\"), dtype=\"float32\")) -> R.Shape([{d}]):\n        n = T.int64()\n        m = T.int64()\n        s: R.Shape([{d}]) = R.shape([{d}])\n        return s\n"
            );
            let m = crate::text::parse_module_str(&src)
                .map_err(|e| proptest::test_runner::TestCaseError::fail(format!("{d}: {e}")))?;
            let printed = crate::text::print_module(&m).text;
            proptest::prop_assert!(printed.contains(&format!("R.shape([{d}])")), "{}\n{}", d, printed);
            let f = m.get("main").ok_or_else(|| proptest::test_runner::TestCaseError::fail("no main"))?;
            let back = match &f.ret_ty {
                crate::ir::Type::Shape { dims: Some(dims), .. } => dims.first().cloned(),
                _ => None,
            };
            proptest::prop_assert_eq!(back, Some(d));
        }
    }

    #[test]
    fn evaluates() {
        let d = Dim::sym("n").mul(&Dim::Static(2)).add(&Dim::Static(1));
        let v = d.eval(&|s: &Sym| (s.name() == "n").then_some(5));
        assert_eq!(v, Some(11));
    }
}
