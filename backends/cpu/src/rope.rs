//! Rotary position embedding (RoPE) in one pass: `x · cos + rotate_half(x) · sin`, as the
//! torch exporters write LLaMA's, Mistral's and Qwen2's `apply_rotary_pos_emb` (the
//! `cpu.rope` composite of the transformer patterns).
//!
//! Contract:
//!
//! - [`rope`] takes `x: [..., d]` with `d = 2 · half`, and `cos`, `sin` of `d` elements per row
//!   that broadcast to `x`'s shape (right-aligned dims equal to `x`'s or 1, no more dims than
//!   `x`: the output has `x`'s shape); `Ok(None)` for anything else (the caller interprets the
//!   body). `rotate_half(x)[j]` is `-x[j + half]` for `j < half` and `x[j - half]` after.
//! - Each element is what the ops give one by one, bit for bit: `x · cos` and
//!   `rotate_half(x) · sin` rounded to `f32`, then their sum, each in the graph's operand order
//!   ([`RopeOrder`]). Rows are split over threads; the result is the same for every count.
//!
//! ```text
//! mul_5: R.Tensor((b, 4, s, 16), dtype="float32") = R.multiply(x, cos)
//! slice_1: R.Tensor((b, 4, s, 8), dtype="float32") = R.strided_slice(x, axes=[3], begin=[0], end=[8])
//! slice_2: R.Tensor((b, 4, s, 8), dtype="float32") = R.strided_slice(x, axes=[3], begin=[8], end=[16])
//! neg: R.Tensor((b, 4, s, 8), dtype="float32") = R.negative(slice_2)
//! cat_1: R.Tensor((b, 4, s, 16), dtype="float32") = R.concat((neg, slice_1), axis=-1)
//! mul_6: R.Tensor((b, 4, s, 16), dtype="float32") = R.multiply(cat_1, sin)
//! gv: R.Tensor((b, 4, s, 16), dtype="float32") = R.add(mul_5, mul_6)
//! ; → rope(x, cos, sin, 8): one pass over x, no slice, concat or product written out
//! ```

use fusebox_core::runtime::Tensor;

type KResult<T> = Result<T, String>;

/// The operand orders of RoPE's ops (the same value either way; kept so a NaN's payload is
/// the one the ops give).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RopeOrder {
    /// `multiply(x, cos)` (else `multiply(cos, x)`).
    pub(crate) x_first: bool,
    /// `multiply(rotated, sin)` (else `multiply(sin, rotated)`).
    pub(crate) rotated_first: bool,
    /// `add(x · cos, rotated · sin)` (else the other order).
    pub(crate) cos_first: bool,
}

/// Per row of `x` (all dims but the last), the offset of the row of a tensor of shape `t`
/// broadcast to `x`'s shape; `None` when `t` does not broadcast to it with rows of `d`.
fn row_offsets(x: &[usize], t: &[usize], d: usize) -> Option<Vec<usize>> {
    if t.len() > x.len() || t.last() != Some(&d) {
        return None;
    }
    let lead = &x[..x.len() - 1];
    // `t`'s dims aligned to `lead` (missing leading dims are 1), and its row strides.
    let pad = x.len() - t.len();
    let dims: Vec<usize> = (0..lead.len())
        .map(|i| if i < pad { 1 } else { t[i - pad] })
        .collect();
    if dims.iter().zip(lead).any(|(&a, &b)| a != b && a != 1) {
        return None;
    }
    let mut strides = vec![0usize; dims.len()];
    let mut s = 1usize;
    for i in (0..dims.len()).rev() {
        strides[i] = if dims[i] == 1 { 0 } else { s };
        s = s.checked_mul(dims[i])?;
    }
    let rows: usize = lead.iter().product();
    let mut out = Vec::with_capacity(rows);
    let mut idx = vec![0usize; lead.len()];
    for _ in 0..rows {
        out.push(idx.iter().zip(&strides).map(|(i, s)| i * s).sum::<usize>() * d);
        crate::util::next_index(&mut idx, lead);
    }
    Some(out)
}

/// `x · cos + rotate_half(x) · sin` (see the module doc).
pub(crate) fn rope(
    x: &Tensor,
    cos: &Tensor,
    sin: &Tensor,
    half: usize,
    order: RopeOrder,
) -> KResult<Option<Tensor>> {
    let (Some(xd), Some(cd), Some(sd)) = (x.as_f32(), cos.as_f32(), sin.as_f32()) else {
        return Ok(None);
    };
    let xs = x.shape();
    let d = half * 2;
    if xs.last() != Some(&d) || half == 0 {
        return Ok(None);
    }
    let (Some(crows), Some(srows)) = (
        row_offsets(xs, cos.shape(), d),
        row_offsets(xs, sin.shape(), d),
    ) else {
        return Ok(None);
    };
    let n = xd.len();
    let rows_per = ((1 << 14) / d).max(1);
    let threads = crate::par::threads_for(n, 1 << 15);
    let mut out = crate::par::scratch_f32(n);
    crate::par::for_each_chunk_mut(&mut out, rows_per * d, threads, |off, chunk| {
        for (i, orow) in chunk.chunks_mut(d).enumerate() {
            let r = off / d + i;
            let (Some(xrow), Some(c), Some(s)) = (
                xd.get(r * d..(r + 1) * d),
                crows.get(r).and_then(|&o| cd.get(o..o + d)),
                srows.get(r).and_then(|&o| sd.get(o..o + d)),
            ) else {
                continue;
            };
            rope_row(xrow, c, s, half, order, orow);
        }
    });
    out.into_tensor(xs.to_vec()).map(Some)
}

/// One row of [`rope`], in a function compiled for the CPU's widest instruction set.
fn rope_row(x: &[f32], c: &[f32], s: &[f32], half: usize, o: RopeOrder, out: &mut [f32]) {
    struct Op<'a>(
        &'a [f32],
        &'a [f32],
        &'a [f32],
        usize,
        RopeOrder,
        &'a mut [f32],
    );
    impl pulp::WithSimd for Op<'_> {
        type Output = ();
        #[inline(always)]
        #[allow(
            clippy::if_same_then_else,
            reason = "the operand order matters for NaN"
        )]
        fn with_simd<S: pulp::Simd>(self, _: S) {
            let Op(x, c, s, half, o, out) = self;
            let (x1, x2) = x.split_at(half);
            let (c1, c2) = c.split_at(half);
            let (s1, s2) = s.split_at(half);
            let (o1, o2) = out.split_at_mut(half);
            let term = |xv: f32, cv: f32, rv: f32, sv: f32| {
                let a = if o.x_first { xv * cv } else { cv * xv };
                let b = if o.rotated_first { rv * sv } else { sv * rv };
                if o.cos_first { a + b } else { b + a }
            };
            // First half: rotated is -x2; second half: rotated is x1.
            for ((((y, &xv), &cv), &sv), &r) in o1.iter_mut().zip(x1).zip(c1).zip(s1).zip(x2) {
                *y = term(xv, cv, -r, sv);
            }
            for ((((y, &xv), &cv), &sv), &r) in o2.iter_mut().zip(x2).zip(c2).zip(s2).zip(x1) {
                *y = term(xv, cv, r, sv);
            }
        }
    }
    crate::simd::dispatch(Op(x, c, s, half, o, out));
}

#[cfg(test)]
mod tests {
    #![allow(clippy::panic, reason = "test code: a failure is a panic")]

    use super::*;

    fn data(len: usize, seed: usize) -> Vec<f32> {
        (0..len)
            .map(|i| ((i * 7919 + seed * 104_729) % 2003) as f32 / 1001.5 - 1.0)
            .collect()
    }

    /// The definition, written out with explicit indices and a materialised `rotate_half`.
    fn definition(x: &[f32], xs: &[usize], cos: &[f32], cs: &[usize], sin: &[f32]) -> Vec<f32> {
        let d = *xs.last().unwrap_or(&1);
        let half = d / 2;
        let rank = xs.len();
        let mut out = vec![0.0f32; x.len()];
        for (flat, y) in out.iter_mut().enumerate() {
            // x's index, then cos's (broadcast) flat index.
            let mut idx = vec![0usize; rank];
            let mut rest = flat;
            for a in (0..rank).rev() {
                idx[a] = rest % xs[a];
                rest /= xs[a];
            }
            let pad = rank - cs.len();
            let mut ci = 0;
            for (a, &n) in cs.iter().enumerate() {
                ci = ci * n + if n == 1 { 0 } else { idx[a + pad] };
            }
            let j = idx[rank - 1];
            let rotated = if j < half {
                -x[flat + half]
            } else {
                x[flat - half]
            };
            *y = x[flat] * cos[ci] + rotated * sin[ci];
        }
        out
    }

    #[test]
    fn rope_matches_its_definition_for_broadcast_cos_and_sin() {
        let order = RopeOrder {
            x_first: true,
            rotated_first: true,
            cos_first: true,
        };
        for (xs, cs) in [
            (vec![2usize, 4, 5, 16], vec![1usize, 1, 5, 16]),
            (vec![1, 3, 7, 8], vec![7, 8]),
            (vec![2, 2, 300, 64], vec![2, 1, 300, 64]),
        ] {
            let n: usize = xs.iter().product();
            let m: usize = cs.iter().product();
            let (x, c, s) = (data(n, 1), data(m, 2), data(m, 3));
            let want = definition(&x, &xs, &c, &cs, &s);
            let t = |sh: &[usize], v: &[f32]| {
                Tensor::from_f32(sh.to_vec(), v.to_vec()).unwrap_or_else(|e| panic!("{e}"))
            };
            let d = xs[xs.len() - 1];
            for threads in [1, 2, 3] {
                let got = crate::par::with_threads(threads, || {
                    rope(&t(&xs, &x), &t(&cs, &c), &t(&cs, &s), d / 2, order)
                })
                .unwrap_or_else(|e| panic!("{e}"))
                .unwrap_or_else(|| panic!("{xs:?}: not handled"));
                assert_eq!(got.shape(), &xs[..]);
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(got.as_f32().unwrap_or(&[])),
                    bits(&want),
                    "{xs:?} with {threads} threads"
                );
            }
        }
    }

    #[test]
    fn shapes_rope_does_not_take_are_left_to_the_interpreter() {
        let t = |sh: &[usize]| {
            let n = sh.iter().product();
            Tensor::from_f32(sh.to_vec(), vec![0.5; n]).unwrap_or_else(|e| panic!("{e}"))
        };
        let o = RopeOrder {
            x_first: true,
            rotated_first: true,
            cos_first: true,
        };
        let none = |r: KResult<Option<Tensor>>| r.unwrap_or_else(|e| panic!("{e}")).is_none();
        let x = t(&[2, 3, 8]);
        assert!(
            none(rope(&x, &t(&[3, 4]), &t(&[3, 8]), 4, o)),
            "a cos row of 4"
        );
        assert!(
            none(rope(&x, &t(&[2, 3, 8]), &t(&[2, 3, 8]), 3, o)),
            "half is not d / 2"
        );
        assert!(
            none(rope(&x, &t(&[4, 3, 8]), &t(&[3, 8]), 4, o)),
            "cos broadcasts x"
        );
        assert!(
            none(rope(&x, &t(&[1, 2, 3, 8]), &t(&[3, 8]), 4, o)),
            "cos of higher rank"
        );
        assert!(!none(rope(&x, &t(&[3, 8]), &t(&[1, 3, 8]), 4, o)));
    }
}
