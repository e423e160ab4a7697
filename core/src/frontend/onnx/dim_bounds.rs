//! What the importer may assume about symbolic dims, and what it proves with that: every
//! symbol is at least 1 (a symbol here is a model's batch or sequence length, or a dim inferred
//! from them; the inferred shapes already assume as much: a slice `x[1:]` of a length-`n` axis
//! has length `n - 1`). From it come bounds on dim expressions ([`lower_bound`],
//! [`upper_bound`]), the `Max` / `Min` of dims the bounds decide ([`dim_extremum`]), and the
//! broadcast of two dims that core inference cannot show equal but that every valid run
//! broadcasts to the larger one ([`broadcast_dims`]), so the importer can annotate such a
//! result's shape (checked at run time, as every annotation is) instead of keeping its rank
//! alone.
//!
//! ```text
//! Max(1 - n, 0)                            → 0            (1 - n is at most 0)
//! Max(2048 - n, 0)                         → T.max(2048 - n, 0)
//! Slice(bias: [16, 1, 2048], start = ^)    → [16, 1, T.min(n, 2048)]
//! Add(scores: [b, 16, n, n], ^)            → R.Tensor(ndim=4), annotated (b, 16, n, n)
//! ```

use crate::ir::{Dim, DimOp};

/// A lower bound of a dim's value, taking every symbol to be at least 1 (a symbol here is a
/// model's batch or sequence length, or a dim inferred from them; the inferred shapes already
/// assume as much: a slice `x[1:]` of a length-`n` axis has length `n - 1`): constants,
/// sums, differences by a constant, products and floor quotients by a positive constant of
/// such dims. `None` when no bound is known.
pub(crate) fn lower_bound(d: &Dim) -> Option<i64> {
    match d {
        Dim::Static(v) => Some(*v),
        Dim::Sym(_) => Some(1),
        Dim::Expr(e) => match e.0 {
            DimOp::Add => lower_bound(&e.1)?.checked_add(lower_bound(&e.2)?),
            DimOp::Sub => lower_bound(&e.1)?.checked_sub(e.2.as_static()?),
            DimOp::Mul => {
                let (a, b) = (lower_bound(&e.1)?, lower_bound(&e.2)?);
                if a >= 0 && b >= 0 {
                    a.checked_mul(b)
                } else {
                    None
                }
            }
            DimOp::FloorDiv => {
                let c = e.2.as_static().filter(|&c| c > 0)?;
                Some(lower_bound(&e.1)?.div_euclid(c))
            }
            DimOp::FloorMod => e.2.as_static().filter(|&c| c > 0).map(|_| 0),
            // Either operand's bound bounds the maximum.
            DimOp::Max => match (lower_bound(&e.1), lower_bound(&e.2)) {
                (Some(a), Some(b)) => Some(a.max(b)),
                (a, b) => a.or(b),
            },
            DimOp::Min => Some(lower_bound(&e.1)?.min(lower_bound(&e.2)?)),
        },
    }
}

/// An upper bound of a dim's value under the same assumption as [`lower_bound`]: constants,
/// and the arithmetic above of dims with upper bounds (`1 - n` is at most 0). `None` when
/// none is known (a symbol has none).
pub(crate) fn upper_bound(d: &Dim) -> Option<i64> {
    match d {
        Dim::Static(v) => Some(*v),
        Dim::Sym(_) => None,
        Dim::Expr(e) => match e.0 {
            DimOp::Add => upper_bound(&e.1)?.checked_add(upper_bound(&e.2)?),
            DimOp::Sub => upper_bound(&e.1)?.checked_sub(lower_bound(&e.2)?),
            DimOp::Mul => {
                let (a, b) = (lower_bound(&e.1)?, lower_bound(&e.2)?);
                if a >= 0 && b >= 0 {
                    upper_bound(&e.1)?.checked_mul(upper_bound(&e.2)?)
                } else {
                    None
                }
            }
            DimOp::FloorDiv => {
                let c = e.2.as_static().filter(|&c| c > 0)?;
                Some(upper_bound(&e.1)?.div_euclid(c))
            }
            DimOp::FloorMod => e.2.as_static().filter(|&c| c > 0).map(|c| c - 1),
            DimOp::Max => Some(upper_bound(&e.1)?.max(upper_bound(&e.2)?)),
            DimOp::Min => match (upper_bound(&e.1), upper_bound(&e.2)) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            },
        },
    }
}

/// `T.max(a, b)` (`max`) or `T.min(a, b)` of two integer values, one of them picked where
/// the bounds ([`lower_bound`], [`upper_bound`]) decide it: MPT's `max(1 - n, 0)` is 0.
pub(crate) fn dim_extremum(max: bool, a: &Dim, b: &Dim) -> Dim {
    // Whether `x >= y` for every value of the symbols.
    let ge = |x: &Dim, y: &Dim| {
        lower_bound(x)
            .zip(upper_bound(y))
            .is_some_and(|(l, u)| l >= u)
    };
    match (ge(a, b), ge(b, a)) {
        (true, _) => if max { a } else { b }.clone(),
        (_, true) => if max { b } else { a }.clone(),
        _ if max => a.maximum(b),
        _ => a.minimum(b),
    }
}

/// Whether `a <= b` for every value of the symbols, as far as the bounds and the structure
/// of `T.min` / `T.max` show (`T.min(n, 2048) <= n`). `budget` caps the steps: nested
/// extrema would otherwise branch at every level.
fn provably_le(a: &Dim, b: &Dim, budget: &mut u32) -> bool {
    if *budget == 0 {
        return false;
    }
    *budget -= 1;
    if a.provably_eq(b)
        || upper_bound(a)
            .zip(lower_bound(b))
            .is_some_and(|(u, l)| u <= l)
    {
        return true;
    }
    if let Dim::Expr(e) = a
        && e.0 == DimOp::Min
        && (provably_le(&e.1, b, budget) || provably_le(&e.2, b, budget))
    {
        return true;
    }
    if let Dim::Expr(e) = b
        && e.0 == DimOp::Max
        && (provably_le(a, &e.1, budget) || provably_le(a, &e.2, budget))
    {
        return true;
    }
    false
}

/// The broadcast of two dims when every run where they broadcast gives the same extent:
/// equal dims; a static 1 against anything; a dim that cannot be 1 (a static 64, or one
/// bounded away from 1) against anything: the other is then that dim or 1, and the result is
/// that dim (Mamba2's `(n + 7) // 8 * 512 // n` positions times 64 heads' values); or
/// `1 <= a <= b` (then `a` is 1 or `b`, and the result is `b` either way). `None` when none
/// of these is shown.
pub(crate) fn broadcast_dim(a: &Dim, b: &Dim) -> Option<Dim> {
    let at_least_one = |d: &Dim| lower_bound(d).is_some_and(|l| l >= 1);
    let never_one =
        |d: &Dim| lower_bound(d).is_some_and(|l| l >= 2) || upper_bound(d).is_some_and(|u| u <= 0);
    if a.provably_eq(b) || *b == Dim::Static(1) || never_one(a) {
        return Some(a.clone());
    }
    if *a == Dim::Static(1) || never_one(b) {
        return Some(b.clone());
    }
    if at_least_one(a) && provably_le(a, b, &mut 64) {
        return Some(b.clone());
    }
    if at_least_one(b) && provably_le(b, a, &mut 64) {
        return Some(a.clone());
    }
    None
}

/// Numpy broadcasting of shapes by [`broadcast_dim`]: `None` where a pair is not decided.
pub(crate) fn broadcast_dims(shapes: &[&[Dim]]) -> Option<Vec<Dim>> {
    let rank = shapes.iter().map(|s| s.len()).max()?;
    let mut out = vec![Dim::Static(1); rank];
    for s in shapes {
        let off = rank - s.len();
        for (i, d) in s.iter().enumerate() {
            out[off + i] = broadcast_dim(&out[off + i], d)?;
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n() -> Dim {
        Dim::sym("n")
    }

    #[test]
    fn bounds_decide_extrema() {
        let one_minus_n = Dim::Static(1).sub(&n());
        assert_eq!(upper_bound(&one_minus_n), Some(0));
        assert_eq!(
            dim_extremum(true, &one_minus_n, &Dim::Static(0)),
            Dim::Static(0)
        );
        assert_eq!(
            dim_extremum(false, &one_minus_n, &Dim::Static(0)),
            one_minus_n
        );
        let start = dim_extremum(true, &Dim::Static(2048).sub(&n()), &Dim::Static(0));
        assert_eq!(start.to_string(), "T.max(2048 - n, 0)");
        assert_eq!(lower_bound(&start), Some(0));
        assert_eq!(upper_bound(&start), Some(2047));
        // The slice from that start to the end of 2048.
        let len = Dim::Static(2048).sub(&start);
        assert_eq!(len.to_string(), "T.min(n, 2048)");
        assert_eq!(
            (lower_bound(&len), upper_bound(&len)),
            (Some(1), Some(2048))
        );
        // Static operands fold whatever the order.
        assert_eq!(
            dim_extremum(true, &Dim::Static(3), &Dim::Static(7)),
            Dim::Static(7)
        );
        assert_eq!(
            dim_extremum(false, &Dim::Static(3), &Dim::Static(7)),
            Dim::Static(3)
        );
    }

    #[test]
    fn a_dim_bounded_by_another_broadcasts_to_it() {
        let len = Dim::Static(2048).sub(&dim_extremum(
            true,
            &Dim::Static(2048).sub(&n()),
            &Dim::Static(0),
        ));
        assert_eq!(broadcast_dim(&n(), &len), Some(n()));
        assert_eq!(broadcast_dim(&len, &n()), Some(n()));
        assert_eq!(
            broadcast_dims(&[&[Dim::Static(2), n(), n()], &[Dim::Static(1), len.clone()]]),
            Some(vec![Dim::Static(2), n(), n()])
        );
        // Two unrelated symbols, or a dim that may be 0 (`n - 1`), stay undecided.
        let m = Dim::sym("m");
        assert_eq!(broadcast_dim(&n(), &m), None);
        let n1 = n().sub(&Dim::Static(1));
        assert_eq!(broadcast_dim(&n1, &n()), None);
        // `n % 4` against `n`: either may be 1, and `n % 4` may be 0.
        let r = Dim::binary(DimOp::FloorMod, n(), Dim::Static(4));
        assert_eq!(broadcast_dim(&r, &n()), None);
        // A dim that is never 1 decides: `n + 4` is at least 5, 64 is 64, `-n` is negative.
        let n4 = n().add(&Dim::Static(4));
        assert_eq!(broadcast_dim(&r, &n4), Some(n4.clone()));
        let hole = n()
            .add(&Dim::Static(7))
            .floor_div(&Dim::Static(8))
            .mul(&Dim::Static(512))
            .floor_div(&n());
        assert_eq!(
            broadcast_dim(&hole, &Dim::Static(64)),
            Some(Dim::Static(64))
        );
        assert_eq!(
            broadcast_dim(&Dim::Static(64), &hole),
            Some(Dim::Static(64))
        );
        assert_eq!(broadcast_dim(&hole, &Dim::Static(1)), Some(hole.clone()));
        let neg = Dim::Static(0).sub(&n());
        assert_eq!(broadcast_dim(&neg, &m), Some(neg.clone()));
        // `T.max(n, m) >= n`, and `n >= 1`: n broadcasts to it.
        let mx = n().maximum(&m);
        assert_eq!(broadcast_dim(&n(), &mx), Some(mx.clone()));
    }

    #[test]
    fn every_decided_broadcast_holds_on_values() {
        // For each pair below and every n >= 1 where the two broadcast (equal, or one of them
        // 1), the extent broadcast_dim gives is the one numpy gives.
        let c = Dim::Static;
        let len = c(8).sub(&dim_extremum(true, &c(8).sub(&n()), &c(0)));
        let hole = n().add(&c(7)).floor_div(&c(8)).mul(&c(512)).floor_div(&n());
        let pairs = [
            (len.clone(), n()),
            (n(), len.clone()),
            (hole.clone(), c(64)),
            (c(64), hole.clone()),
            (hole.clone(), n()),
            (n().add(&c(1)), n()),
            (n().sub(&c(1)), c(1)),
            (Dim::binary(DimOp::FloorMod, n(), c(3)), n().add(&c(3))),
            (n().minimum(&c(3)), n().maximum(&c(2))),
        ];
        let mut decided = 0;
        for (a, b) in &pairs {
            let Some(got) = broadcast_dim(a, b) else {
                continue;
            };
            decided += 1;
            for v in 1..200 {
                let at = |d: &Dim| d.eval(&|_| Some(v)).unwrap();
                let (x, y) = (at(a), at(b));
                if x == y || x == 1 || y == 1 {
                    let want = if x == 1 { y } else { x };
                    assert_eq!(at(&got), want, "{a} against {b} at n = {v}");
                }
            }
        }
        assert!(decided >= 6, "{decided}");
    }
}
