//! Tests of the transformer kernels (`attention.rs`, `norm.rs`) against naive references
//! written independently here (materialised scores, softmax in `f64`); the composite path
//! (`composite.rs` through the executor) against the interpreted body is in
//! [`composites`], the shared `f32` math functions in [`math`].

use crate::attention::{AttnSpec, Causal, Scale, SelectMask, attention};
use fusebox_core::runtime::{Tensor, Value};

mod composites;
mod math;

/// A deterministic generator of floats in [-1, 1).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    fn tensor(&mut self, shape: &[usize]) -> Tensor {
        let n = shape.iter().product();
        Tensor::from_f32(shape.to_vec(), (0..n).map(|_| self.next()).collect()).unwrap()
    }
}

/// The bits of `v`, to compare results NaN and all.
fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Row-major index of `idx` in `shape`, broadcasting dims of 1 (right-aligned).
fn at(shape: &[usize], idx: &[usize]) -> usize {
    let off = idx.len() - shape.len();
    let mut o = 0;
    for (k, &n) in shape.iter().enumerate() {
        let i = if n == 1 { 0 } else { idx[off + k] };
        o = o * n + i;
    }
    o
}

/// The definition: scores materialised, softmax in f64, GQA by `h * hk / hq`.
#[allow(clippy::too_many_arguments, reason = "the definition's inputs")]
fn naive(
    q: &Tensor,
    kt: &Tensor,
    v: &Tensor,
    masks: &[&Tensor],
    sq: f32,
    sk: f32,
    causal: bool,
    guard: bool,
) -> Vec<f32> {
    naive_select(q, kt, v, masks, None, sq, sk, causal, guard)
}

/// [`naive`] with a select mask: `where(cond, fill, scores)` after the additive masks.
#[allow(clippy::too_many_arguments, reason = "the definition's inputs")]
fn naive_select(
    q: &Tensor,
    kt: &Tensor,
    v: &Tensor,
    masks: &[&Tensor],
    select: Option<(&[bool], &[usize], f32)>,
    sq: f32,
    sk: f32,
    causal: bool,
    guard: bool,
) -> Vec<f32> {
    let (qs, ks, vs) = (q.shape(), kt.shape(), v.shape());
    let (b, hq, s, d) = (qs[0], qs[1], qs[2], qs[3]);
    let (hk, t, dv) = (ks[1], ks[3], vs[3]);
    let (qd, kd, vd) = (
        q.as_f32().unwrap(),
        kt.as_f32().unwrap(),
        v.as_f32().unwrap(),
    );
    let mut out = vec![0.0f32; b * hq * s * dv];
    for bi in 0..b {
        for h in 0..hq {
            let kh = h * hk / hq;
            for i in 0..s {
                let mut sc = vec![0.0f64; t];
                for (j, x) in sc.iter_mut().enumerate() {
                    let mut acc = 0.0f64;
                    for dd in 0..d {
                        let qv = qd[((bi * hq + h) * s + i) * d + dd] * sq;
                        let kv = kd[((bi * hk + kh) * d + dd) * t + j] * sk;
                        acc += f64::from(qv) * f64::from(kv);
                    }
                    // The graph adds the masks one by one in f32.
                    let mut a32 = acc as f32;
                    for m in masks {
                        a32 += m.as_f32().unwrap()[at(m.shape(), &[bi, h, i, j])];
                    }
                    if !masks.is_empty() {
                        acc = f64::from(a32);
                    }
                    if let Some((c, shape, fill)) = select
                        && c[at(shape, &[bi, h, i, j])]
                    {
                        acc = f64::from(fill);
                    }
                    if causal && j > i + t - s {
                        acc = f64::NEG_INFINITY;
                    }
                    *x = acc;
                }
                let mx = sc.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let sum: f64 = sc.iter().map(|x| (x - mx).exp()).sum();
                let p: Vec<f64> = sc
                    .iter()
                    .map(|x| {
                        let p = (x - mx).exp() / sum;
                        if guard && p.is_nan() { 0.0 } else { p }
                    })
                    .collect();
                for e in 0..dv {
                    let mut acc = 0.0f64;
                    for (j, &pj) in p.iter().enumerate() {
                        acc += pj * f64::from(vd[((bi * hk + kh) * t + j) * dv + e]);
                    }
                    out[((bi * hq + h) * s + i) * dv + e] = acc as f32;
                }
            }
        }
    }
    out
}

fn close(got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len());
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        assert!(
            (a - b).abs() <= tol || (a.is_nan() && b.is_nan()),
            "element {i}: {a} vs {b}"
        );
    }
}

fn spec(sq: f32, sk: f32, causal: Option<usize>, guard: bool) -> AttnSpec {
    AttnSpec {
        q_scale: Scale::Mul(sq),
        k_scale: Scale::Mul(sk),
        nan_guard: guard,
        causal: causal.map(Causal::Offset),
    }
}

#[test]
fn attention_matches_the_materialised_definition() {
    let mut r = Rng(0x9e37_79b9_7f4a_7c15);
    // (batch, q heads, kv heads, S, T, D, Dv): odd sizes, several key blocks, GQA.
    for &(b, hq, hk, s, t, d, dv) in &[
        (2, 2, 2, 16, 16, 16, 16),
        (1, 3, 3, 7, 130, 5, 9),
        (2, 4, 2, 33, 65, 8, 8),
        (1, 6, 1, 1, 3, 4, 3),
        (1, 2, 2, 70, 70, 12, 12),
    ] {
        let q = r.tensor(&[b, hq, s, d]);
        let kt = r.tensor(&[b, hk, d, t]);
        let v = r.tensor(&[b, hk, t, dv]);
        // A padding mask [b, 1, 1, T] and a full one [b, hq, S, T].
        let pad = Tensor::from_f32(
            vec![b, 1, 1, t],
            (0..b * t)
                .map(|i| if i % t >= t - t / 4 { -3.4e38 } else { 0.0 })
                .collect(),
        )
        .unwrap();
        let full = r.tensor(&[b, hq, s, t]);
        for mask in [vec![], vec![&pad], vec![&full], vec![&full, &pad]] {
            for causal in [false, true] {
                if causal && t < s {
                    continue;
                }
                let sp = spec(0.5, 0.25, causal.then(|| t - s), true);
                let got = attention(&q, &kt, &v, mask.as_slice(), None, &sp)
                    .unwrap()
                    .unwrap();
                assert_eq!(got.shape(), &[b, hq, s, dv]);
                let want = naive(&q, &kt, &v, &mask, 0.5, 0.25, causal, true);
                close(got.as_f32().unwrap(), &want, 1e-5);
            }
        }
    }
}

#[test]
fn attention_nan_guard_zeroes_fully_masked_rows() {
    let mut r = Rng(7);
    let (q, kt, v) = (
        r.tensor(&[1, 1, 3, 4]),
        r.tensor(&[1, 1, 4, 5]),
        r.tensor(&[1, 1, 5, 2]),
    );
    // Row 1 sees only -inf.
    let m: Vec<f32> = (0..15)
        .map(|i| if i / 5 == 1 { f32::NEG_INFINITY } else { 0.0 })
        .collect();
    let mask = Tensor::from_f32(vec![1, 1, 3, 5], m).unwrap();
    let guarded = attention(&q, &kt, &v, &[&mask], None, &spec(1.0, 1.0, None, true))
        .unwrap()
        .unwrap();
    let g = guarded.as_f32().unwrap();
    assert_eq!(&g[2..4], &[0.0, 0.0]);
    let want = naive(&q, &kt, &v, &[&mask], 1.0, 1.0, false, true);
    close(g, &want, 1e-5);
    let raw = attention(&q, &kt, &v, &[&mask], None, &spec(1.0, 1.0, None, false))
        .unwrap()
        .unwrap();
    assert!(raw.as_f32().unwrap()[2].is_nan());
}

#[test]
fn attention_scales_divide_as_the_graph_does() {
    let mut r = Rng(11);
    let (q, kt, v) = (
        r.tensor(&[2, 2, 5, 8]),
        r.tensor(&[2, 2, 8, 5]),
        r.tensor(&[2, 2, 5, 8]),
    );
    let div = AttnSpec {
        q_scale: Scale::Div(8f32.sqrt()),
        k_scale: Scale::None,
        nan_guard: false,
        causal: None,
    };
    let got = attention(&q, &kt, &v, &[], None, &div).unwrap().unwrap();
    let want = naive(&q, &kt, &v, &[], 1.0 / 8f32.sqrt(), 1.0, false, false);
    close(got.as_f32().unwrap(), &want, 1e-5);
}

#[test]
fn attention_declines_shapes_it_does_not_handle() {
    let mut r = Rng(3);
    // 3 query heads cannot group 2 key heads.
    let (q, kt, v) = (
        r.tensor(&[1, 3, 4, 4]),
        r.tensor(&[1, 2, 4, 4]),
        r.tensor(&[1, 2, 4, 4]),
    );
    assert!(
        attention(&q, &kt, &v, &[], None, &spec(1.0, 1.0, None, false))
            .unwrap()
            .is_none()
    );
    // kᵀ's rows must be q's columns.
    let bad = r.tensor(&[1, 3, 5, 4]);
    assert!(attention(&q, &bad, &q, &[], None, &spec(1.0, 1.0, None, false)).is_err());
}

/// `run` gives the same bits on 2 and 3 kernel threads as on 1.
fn same_bits_for_every_thread_count(run: impl Fn() -> Vec<Vec<u32>> + Sync) {
    let one = crate::par::with_threads(1, &run);
    for n in [2, 3] {
        assert!(
            crate::par::with_threads(n, &run) == one,
            "{n} threads differ from 1"
        );
    }
}

/// `permute_dims` materialised by the generic gather (not the attention's strided views).
fn permuted(t: &Tensor, perm: &[usize]) -> Tensor {
    crate::util::permute(t, perm)
}

#[test]
fn attention_reads_and_writes_the_heads_transposes_in_place() {
    // The exporters' layout: q, k, v as the projections leave them, [B, S, H, D]; kᵀ is
    // k.permute(0, 2, 3, 1); the output goes back to [B, S, H, Dv]. Grouped-query heads (4
    // query heads on 2 key heads), a mask, causal rows, (1100 keys) more than one key block,
    // and (300 queries) more than one task's rows of a head.
    use crate::attention::{Operand, attention_permuted};
    let mut r = Rng(17);
    for (b, s, t, hq, hk, d, dv, causal) in [
        (2, 5, 5, 3, 3, 8, 8, None),
        (1, 37, 37, 4, 2, 16, 8, Some(0)),
        (1, 20, 1100, 2, 2, 8, 4, Some(1080)),
        (2, 1, 9, 12, 4, 4, 4, None),
        (1, 300, 40, 2, 1, 8, 8, None),
        (1, 300, 300, 2, 1, 8, 8, Some(0)),
    ] {
        let q = r.tensor(&[b, s, hq, d]);
        let k = r.tensor(&[b, t, hk, d]);
        let v = r.tensor(&[b, t, hk, dv]);
        let mask = r.tensor(&[b, 1, s, t]);
        let sp = spec(0.5, 0.25, causal, true);
        let (pq, pk, pv, po) = ([0, 2, 1, 3], [0, 2, 3, 1], [0, 2, 1, 3], [0, 2, 1, 3]);
        let (qh, kt, vh) = (permuted(&q, &pq), permuted(&k, &pk), permuted(&v, &pv));
        let want = naive(&qh, &kt, &vh, &[&mask], 0.5, 0.25, causal.is_some(), true);
        let want = Tensor::from_f32(vec![b, hq, s, dv], want).unwrap();
        let want = permuted(&want, &po);
        let op = |t, p| Operand { t, perm: Some(p) };
        let call = |out: Option<&[usize]>| {
            attention_permuted(
                op(&q, &pq[..]),
                op(&k, &pk[..]),
                op(&v, &pv[..]),
                &[&mask],
                None,
                &sp,
                out,
            )
            .unwrap()
            .unwrap()
        };
        let got = call(Some(&po[..]));
        assert_eq!(got.shape(), &[b, s, hq, dv][..]);
        close(got.as_f32().unwrap(), want.as_f32().unwrap(), 1e-5);
        // Permuted inputs with the output as the heads' order, and the same bits for every
        // thread count.
        let heads_first = call(None);
        assert_eq!(heads_first.shape(), &[b, hq, s, dv][..]);
        close(
            permuted(&heads_first, &po).as_f32().unwrap(),
            want.as_f32().unwrap(),
            1e-5,
        );
        same_bits_for_every_thread_count(|| vec![bits(call(Some(&po[..])).as_f32().unwrap())]);
    }
    // An output order that moves the last dim, or a perm that is not one, is declined.
    let (q, k) = (r.tensor(&[1, 4, 2, 8]), r.tensor(&[1, 4, 2, 8]));
    let (pq, pk) = ([0, 2, 1, 3], [0, 2, 3, 1]);
    let op = |t, p| Operand { t, perm: Some(p) };
    for (out, bad_q) in [(Some(&[0, 1, 3, 2][..]), false), (None, true)] {
        let qp: &[usize] = if bad_q { &[0, 2, 2, 3] } else { &pq };
        let got = attention_permuted(
            op(&q, qp),
            op(&k, &pk[..]),
            op(&k, &pq[..]),
            &[],
            None,
            &spec(1.0, 1.0, None, false),
            out,
        );
        assert!(got.unwrap().is_none());
    }
}

/// A random select condition of `shape` (true with probability about `(1 - p) / 2`), its
/// first row true everywhere (a row whose every key is selected: the softmax of a constant
/// row), as values and as a `bool` tensor.
fn select_cond(r: &mut Rng, shape: &[usize], p: f32) -> (Vec<bool>, Tensor) {
    let n: usize = shape.iter().product();
    let mut cd: Vec<bool> = (0..n).map(|_| r.next() > p).collect();
    let row = shape.last().copied().unwrap_or(1);
    cd[..row].iter_mut().for_each(|c| *c = true);
    let t = Tensor::new(
        shape.to_vec(),
        fusebox_core::runtime::Storage::Bool(cd.clone()),
    )
    .unwrap();
    (cd, t)
}

#[test]
fn a_select_mask_replaces_the_scores_it_selects() {
    // MPT's and DeBERTa's masked_fill: where(cond, fill, scores + mask) before the softmax,
    // cond broadcast over heads (and over rows), rows with every key selected (the softmax of
    // a constant row is uniform), plain and permuted operands, more than one key block.
    use crate::attention::{Operand, attention_permuted};
    let mut r = Rng(29);
    for (b, h, s, t, cond_shape, fill) in [
        (2, 3, 6, 6, vec![2, 1, 6, 6], -3.402_823_5e38_f32),
        (1, 2, 9, 1100, vec![1, 1, 1, 1100], f32::NEG_INFINITY),
        (1, 2, 5, 7, vec![5, 7], -1.0e4),
    ] {
        let q = r.tensor(&[b, h, s, 8]);
        let kt = r.tensor(&[b, h, 8, t]);
        let v = r.tensor(&[b, h, t, 4]);
        let mask = r.tensor(&[b, 1, s, t]);
        let (cd, cond) = select_cond(&mut r, &cond_shape, 0.3);
        let sp = spec(0.5, 1.0, None, true);
        let want = naive_select(
            &q,
            &kt,
            &v,
            &[&mask],
            Some((&cd, &cond_shape, fill)),
            0.5,
            1.0,
            false,
            true,
        );
        let got = attention(
            &q,
            &kt,
            &v,
            &[&mask],
            Some(SelectMask::plain(&cond, fill)),
            &sp,
        )
        .unwrap()
        .unwrap();
        close(got.as_f32().unwrap(), &want, 1e-5);
        // Without the select the result differs (the test would notice a kernel ignoring it).
        let unmasked = attention(&q, &kt, &v, &[&mask], None, &sp)
            .unwrap()
            .unwrap();
        assert!(
            unmasked
                .as_f32()
                .unwrap()
                .iter()
                .zip(&want)
                .any(|(a, b)| (a - b).abs() > 1e-3)
        );
        // Permuted operands read in place give the same.
        let perm = [0, 2, 1, 3];
        let (qp, vp) = (permuted(&q, &perm), permuted(&v, &perm));
        let got_p = attention_permuted(
            Operand {
                t: &qp,
                perm: Some(&perm),
            },
            Operand::plain(&kt),
            Operand {
                t: &vp,
                perm: Some(&perm),
            },
            &[&mask],
            Some(SelectMask::plain(&cond, fill)),
            &sp,
            None,
        )
        .unwrap()
        .unwrap();
        close(got_p.as_f32().unwrap(), &want, 1e-5);
        same_bits_for_every_thread_count(|| {
            let o = attention(
                &q,
                &kt,
                &v,
                &[&mask],
                Some(SelectMask::plain(&cond, fill)),
                &sp,
            );
            vec![bits(o.unwrap().unwrap().as_f32().unwrap())]
        });
    }
    // A condition that is not bool, or does not broadcast to the scores, is declined.
    let q = r.tensor(&[1, 1, 3, 4]);
    let kt = r.tensor(&[1, 1, 4, 5]);
    let bad = Tensor::new(vec![4], fusebox_core::runtime::Storage::Bool(vec![true; 4])).unwrap();
    let sp = spec(1.0, 1.0, None, false);
    let v = r.tensor(&[1, 1, 5, 2]);
    assert!(
        attention(&q, &kt, &v, &[], Some(SelectMask::plain(&bad, 0.0)), &sp)
            .unwrap()
            .is_none()
    );
    let f = r.tensor(&[5]);
    assert!(
        attention(&q, &kt, &v, &[], Some(SelectMask::plain(&f, 0.0)), &sp)
            .unwrap()
            .is_none()
    );
}

#[test]
fn a_select_through_a_view_of_the_scores_broadcasts_over_the_view() {
    // DeBERTa: `[B·H, S, T]` scores (plus a `[B·H, S, T]` relative-position term) viewed as
    // `[B, H, S, T]` for a `[B, 1, S, T]` condition, then viewed back. The definition runs on
    // the 4-D tensors; the kernel on their 3-D views, the condition read through the view.
    let mut r = Rng(31);
    let (b, h, s, t, d, dv, fill) = (2, 3, 5, 7, 8, 4, -3.402_823_5e38_f32);
    let (q4, kt4, v4, bias4) = (
        r.tensor(&[b, h, s, d]),
        r.tensor(&[b, h, d, t]),
        r.tensor(&[b, h, t, dv]),
        r.tensor(&[b, h, s, t]),
    );
    let cond_shape = [b, 1, s, t];
    let (cd, cond) = select_cond(&mut r, &cond_shape, 0.2);
    let sp = spec(1.0, 0.25, None, false);
    let want = naive_select(
        &q4,
        &kt4,
        &v4,
        &[&bias4],
        Some((&cd, &cond_shape, fill)),
        1.0,
        0.25,
        false,
        false,
    );
    let flat = |x: &Tensor| {
        let sh = x.shape();
        Tensor::from_f32(
            vec![sh[0] * sh[1], sh[2], sh[3]],
            x.as_f32().unwrap().to_vec(),
        )
        .unwrap()
    };
    let (q, kt, v, bias) = (flat(&q4), flat(&kt4), flat(&v4), flat(&bias4));
    let run = |view: &[Option<usize>]| {
        let sel = SelectMask {
            cond: &cond,
            fill,
            view: Some(view),
        };
        attention(&q, &kt, &v, &[&bias], Some(sel), &sp).unwrap()
    };
    for view in [[None, Some(h)], [Some(b), None], [Some(b), Some(h)]] {
        let got = run(&view).unwrap();
        assert_eq!(got.shape(), &[b * h, s, dv][..]);
        close(got.as_f32().unwrap(), &want, 1e-5);
        same_bits_for_every_thread_count(|| vec![bits(run(&view).unwrap().as_f32().unwrap())]);
    }
    // Heads first (`[H, B]`, the wrong view of the same scores) gives another result: the
    // test would notice a kernel reading the condition by the wrong batch index.
    let swapped = Tensor::new(
        vec![1, b, s, t],
        fusebox_core::runtime::Storage::Bool(cd.clone()),
    )
    .unwrap();
    let wrong = attention(
        &q,
        &kt,
        &v,
        &[&bias],
        Some(SelectMask {
            cond: &swapped,
            fill,
            view: Some(&[Some(h), Some(b)]),
        }),
        &sp,
    )
    .unwrap()
    .unwrap();
    assert!(
        wrong
            .as_f32()
            .unwrap()
            .iter()
            .zip(&want)
            .any(|(a, b)| (a - b).abs() > 1e-3)
    );
    // The condition does not broadcast to the scores' own `[B·H, S, T]`, and views that cannot
    // have B·H batch indices are declined (the body is interpreted then).
    assert!(
        attention(
            &q,
            &kt,
            &v,
            &[&bias],
            Some(SelectMask::plain(&cond, fill)),
            &sp
        )
        .unwrap()
        .is_none()
    );
    for bad in [
        [Some(4), None],
        [None, None],
        [Some(2), Some(2)],
        [Some(0), None],
    ] {
        assert!(run(&bad).is_none(), "{bad:?}");
    }
}

#[test]
fn kernels_give_the_same_bits_for_every_thread_count() {
    let mut r = Rng(5);
    let (q, kt, v) = (
        r.tensor(&[2, 4, 200, 32]),
        r.tensor(&[2, 4, 32, 200]),
        r.tensor(&[2, 4, 200, 32]),
    );
    let (a, b) = (r.tensor(&[400, 96]), r.tensor(&[400, 96]));
    let (g, be) = (r.tensor(&[96]), r.tensor(&[96]));
    let x = r.tensor(&[300, 500]);
    let run = || {
        let o = attention(&q, &kt, &v, &[], None, &spec(0.5, 0.5, Some(0), true))
            .unwrap()
            .unwrap();
        let (s, n) = crate::norm::residual_layer_norm(&a, &b, Some(&g), Some(&be), 1e-5)
            .unwrap()
            .unwrap();
        let rms = crate::norm::rms_norm(&a, Some(&g), 1e-6).unwrap().unwrap();
        let ln = crate::norm::layer_norm(&x, None, None, 1e-5)
            .unwrap()
            .unwrap();
        let ge = crate::norm::gelu(&x, false).unwrap();
        let gt = crate::norm::gelu(&x, true).unwrap();
        [o, s, n, rms, ln, ge, gt]
            .iter()
            .map(|t| bits(t.as_f32().unwrap()))
            .collect()
    };
    same_bits_for_every_thread_count(run);
}

/// A LayerNorm's params both, and without the shift or the scale or both (`center` / `scale`
/// off: MPT's LayerNorm has no bias).
fn param_sets<'a>(g: &'a Tensor, be: &'a Tensor) -> [(Option<&'a Tensor>, Option<&'a Tensor>); 4] {
    [
        (Some(g), Some(be)),
        (Some(g), None),
        (None, Some(be)),
        (None, None),
    ]
}

/// `nn::norm`'s LayerNorm of `x`'s rows by its general loops: `x` as `(rows, 1, w)` normed
/// over its last two axes, which the row kernel does not take.
fn walked_layer_norm(x: &Tensor, g: Option<&Tensor>, b: Option<&Tensor>, eps: f64) -> Tensor {
    let w = *x.shape().last().unwrap();
    let rows = x.as_f32().unwrap().len() / w;
    let as3 = |t: &Tensor, shape: Vec<usize>| {
        Tensor::from_f32(shape, t.as_f32().unwrap().to_vec()).unwrap()
    };
    let x3 = as3(x, vec![rows, 1, w]);
    let (g2, b2) = (g.map(|t| as3(t, vec![1, w])), b.map(|t| as3(t, vec![1, w])));
    let y = crate::nn::norm(&x3, &[-2, -1], eps, g2.as_ref(), b2.as_ref(), false).unwrap();
    as3(&y, x.shape().to_vec())
}

#[test]
fn the_row_layer_norm_gives_the_bits_of_the_general_loops_and_the_definition() {
    let mut r = Rng(29);
    for shape in [vec![1usize], vec![3, 7], vec![2, 5, 5, 96], vec![4, 513]] {
        let w = *shape.last().unwrap();
        let x = r.tensor(&shape);
        let (g, be) = (r.tensor(&[w]), r.tensor(&[w]));
        for (gp, bp) in param_sets(&g, &be) {
            let got = crate::nn::norm(&x, &[-1], 1e-6, gp, bp, false).unwrap();
            assert_eq!(got.shape(), x.shape());
            let walked = walked_layer_norm(&x, gp, bp, 1e-6);
            assert_eq!(bits(got.as_f32().unwrap()), bits(walked.as_f32().unwrap()));
            // The definition, in plain f64 sums.
            let mut want = Vec::new();
            for row in x.as_f32().unwrap().chunks(w) {
                let mean = row.iter().map(|&v| f64::from(v)).sum::<f64>() / w as f64;
                let var = row
                    .iter()
                    .map(|&v| (f64::from(v) - mean).powi(2))
                    .sum::<f64>()
                    / w as f64;
                for (k, &v) in row.iter().enumerate() {
                    let mut y = (f64::from(v) - mean) / (var + 1e-6).sqrt();
                    if let Some(g) = gp {
                        y *= f64::from(g.as_f32().unwrap()[k]);
                    }
                    if let Some(b) = bp {
                        y += f64::from(b.as_f32().unwrap()[k]);
                    }
                    want.push(y as f32);
                }
            }
            close(got.as_f32().unwrap(), &want, 1e-5);
        }
    }
    // A param of the wrong size is still the reference's error.
    let x = r.tensor(&[2, 8]);
    let g = r.tensor(&[7]);
    assert!(crate::nn::norm(&x, &[-1], 1e-5, Some(&g), None, false).is_err());
}

#[test]
fn residual_layer_norm_equals_add_then_the_reference_layer_norm() {
    let mut r = Rng(13);
    for &(rows, w) in &[(1, 1), (3, 7), (50, 96), (7, 513)] {
        let (a, b) = (r.tensor(&[rows, w]), r.tensor(&[rows, w]));
        let (g, be) = (r.tensor(&[w]), r.tensor(&[w]));
        for (gp, bp) in param_sets(&g, &be) {
            let (s, n) = crate::norm::residual_layer_norm(&a, &b, gp, bp, 1e-12)
                .unwrap()
                .unwrap();
            let sum = crate::eval_op(
                &fusebox_core::op::Op::Add,
                &[Value::Tensor(a.clone()), Value::Tensor(b.clone())],
            )
            .unwrap();
            let Value::Tensor(sum) = sum else { panic!() };
            assert_eq!(s.as_f32(), sum.as_f32());
            let want = walked_layer_norm(&sum, gp, bp, 1e-12);
            // Bit-identical to the reference kernel.
            assert_eq!(n.as_f32(), want.as_f32());
        }
    }
    // A broadcast residual is declined.
    let (a, b) = (r.tensor(&[4, 8]), r.tensor(&[1, 8]));
    let (g, be) = (r.tensor(&[8]), r.tensor(&[8]));
    assert!(
        crate::norm::residual_layer_norm(&a, &b, Some(&g), Some(&be), 1e-5)
            .unwrap()
            .is_none()
    );
}

#[test]
fn rms_norm_and_gelu_match_their_definitions() {
    let mut r = Rng(17);
    let x = r.tensor(&[9, 33]);
    let w = r.tensor(&[33]);
    let got = crate::norm::rms_norm(&x, Some(&w), 1e-6).unwrap().unwrap();
    let (xd, wd) = (x.as_f32().unwrap(), w.as_f32().unwrap());
    let mut want = Vec::new();
    for row in xd.chunks(33) {
        let ms: f64 = row
            .iter()
            .map(|&v| f64::from(v) * f64::from(v))
            .sum::<f64>()
            / 33.0;
        let inv = 1.0 / (ms + 1e-6).sqrt();
        want.extend(
            row.iter()
                .zip(wd)
                .map(|(&v, &g)| (f64::from(v) * inv * f64::from(g)) as f32),
        );
    }
    close(got.as_f32().unwrap(), &want, 1e-5);
    let x = r.tensor(&[1000]);
    let xs: Vec<f64> = x
        .as_f32()
        .unwrap()
        .iter()
        .map(|&v| f64::from(v) * 4.0)
        .collect();
    let x = Tensor::from_f32(vec![1000], xs.iter().map(|&v| v as f32).collect()).unwrap();
    let erf = crate::norm::gelu(&x, false).unwrap();
    let tanh = crate::norm::gelu(&x, true).unwrap();
    // erf by its series/continued fraction in elementwise.rs is checked elsewhere; here the
    // tanh form is defined independently and the erf form against libm-free Abramowitz-Stegun.
    for (i, &v) in xs.iter().enumerate() {
        let t = 0.5
            * v
            * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (v + 0.044715 * v * v * v)).tanh());
        assert!(
            (f64::from(tanh.as_f32().unwrap()[i]) - t).abs() < 1e-5,
            "tanh gelu at {v}"
        );
        // Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7).
        let z = v / std::f64::consts::SQRT_2;
        let s = z.signum();
        let a = z.abs();
        let k = 1.0 / (1.0 + 0.327_591_1 * a);
        let poly = k
            * (0.254_829_592
                + k * (-0.284_496_736
                    + k * (1.421_413_741 + k * (-1.453_152_027 + k * 1.061_405_429))));
        let e = s * (1.0 - poly * (-a * a).exp());
        let want = 0.5 * v * (1.0 + e);
        assert!(
            (f64::from(erf.as_f32().unwrap()[i]) - want).abs() < 1e-5,
            "erf gelu at {v}"
        );
    }
}

#[test]
fn a_nan_key_or_value_spreads_as_the_materialised_definition_spreads_it() {
    // A NaN in one key (column 3 of kᵀ) or one value row (row 3 of v) reaches every query that
    // sees that key, through an additive mask too, as the graph computes it; a causal mask
    // hides it from the queries before it. Several key blocks (T = 130) so the online softmax
    // meets the NaN after it has rescaled.
    let mut r = Rng(23);
    let (b, h, s, t, d) = (1, 2, 9, 130, 4);
    let q = r.tensor(&[b, h, s, d]);
    let pad = Tensor::from_f32(vec![b, 1, 1, t], vec![0.0; t]).unwrap();
    // (NaN in k, NaN in v, the key): both is what a NaN hidden state gives (a zero row
    // through an RMSNorm without epsilon, Helium's padding embedding): the guard zeroes the
    // rows that see the key, and `0 * NaN` in the product with v keeps them NaN.
    for (in_k, in_v, col) in [
        (true, false, 3),
        (false, true, 3),
        (true, false, 125),
        (false, true, 128),
        (true, true, 87),
    ] {
        let mut kt = r.tensor(&[b, h, d, t]);
        let mut v = r.tensor(&[b, h, t, d]);
        if in_k {
            let mut k = kt.as_f32().unwrap().to_vec();
            k[2 * t + col] = f32::NAN;
            kt = Tensor::from_f32(vec![b, h, d, t], k).unwrap();
        }
        if in_v {
            let mut vv = v.as_f32().unwrap().to_vec();
            vv[col * d + 1] = f32::NAN;
            v = Tensor::from_f32(vec![b, h, t, d], vv).unwrap();
        }
        for mask in [vec![], vec![&pad]] {
            for causal in [false, true] {
                for guard in [false, true] {
                    let sp = spec(1.0, 1.0, causal.then(|| t - s), guard);
                    let got = attention(&q, &kt, &v, mask.as_slice(), None, &sp)
                        .unwrap()
                        .unwrap();
                    let want = naive(&q, &kt, &v, &mask, 1.0, 1.0, causal, guard);
                    close(got.as_f32().unwrap(), &want, 1e-5);
                }
            }
        }
    }
}

#[test]
fn the_striped_row_maximum_is_the_sequential_one_nan_ignored() {
    // The softmax's row maximum, 64 running maxima folded by halves, against a plain left
    // fold: every length around the lane count, with NaNs, infinities and all-NaN rows.
    let mut r = Rng(5);
    for n in [0usize, 1, 5, 63, 64, 65, 127, 128, 197, 300] {
        for special in [
            None,
            Some(f32::NAN),
            Some(f32::INFINITY),
            Some(f32::NEG_INFINITY),
        ] {
            let mut row = r.tensor(&[n]).as_f32().unwrap().to_vec();
            if let Some(x) = special {
                for j in (0..n).step_by(7) {
                    row[j] = x;
                }
            }
            let want = row.iter().fold(f32::NEG_INFINITY, |a, &x| a.max(x));
            let got = crate::attention::striped_max_f32(&row);
            assert_eq!(got.to_bits(), want.to_bits(), "n {n}, {special:?}");
        }
        let nans = vec![f32::NAN; n];
        assert_eq!(crate::attention::striped_max_f32(&nans), f32::NEG_INFINITY);
    }
}
