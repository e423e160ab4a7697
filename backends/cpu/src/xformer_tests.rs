//! Tests of the transformer kernels (`attention.rs`, `norm.rs`) against naive references
//! written independently here (materialised scores, softmax in `f64`), and of the composite
//! path (`composite.rs` through the executor) against the interpreted body.

use crate::attention::{AttnSpec, Causal, Scale, SelectMask, attention};
use fusebox_core::runtime::{Tensor, Value};

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
        let ge = crate::norm::gelu(&x, false).unwrap();
        let gt = crate::norm::gelu(&x, true).unwrap();
        [o, s, n, rms, ge, gt]
            .iter()
            .map(|t| bits(t.as_f32().unwrap()))
            .collect()
    };
    same_bits_for_every_thread_count(run);
}

#[test]
fn residual_layer_norm_equals_add_then_the_reference_layer_norm() {
    let mut r = Rng(13);
    for &(rows, w) in &[(1, 1), (3, 7), (50, 96), (7, 513)] {
        let (a, b) = (r.tensor(&[rows, w]), r.tensor(&[rows, w]));
        let (g, be) = (r.tensor(&[w]), r.tensor(&[w]));
        // With both params, and without the shift or the scale or both (`center` / `scale`
        // off: MPT's LayerNorm has no bias).
        for (gp, bp) in [
            (Some(&g), Some(&be)),
            (Some(&g), None),
            (None, Some(&be)),
            (None, None),
        ] {
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
            let want = crate::nn::norm(&sum, &[-1], 1e-12, gp, bp, false).unwrap();
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

/// The TorchScript exporter's attention, as a composite; with `Composite` the executor runs
/// the fused kernel, without it the ops one by one.
const ATTN: &str = r#"@I.ir_module
class Module:
    @R.function(private=True)
    def attn(q: R.Tensor((2, 2, 10, 8), dtype="float32"), kt: R.Tensor((2, 2, 8, 10), dtype="float32"), mask: R.Tensor((2, 1, 10, 10), dtype="float32"), v: R.Tensor((2, 2, 10, 8), dtype="float32")) -> R.Tensor((2, 2, 10, 8), dtype="float32"):
        R.func_attr({"Composite": "cpu.attention", "Primitive": True})
        with R.dataflow():
            lv: R.Tensor((2, 2, 10, 8), dtype="float32") = R.multiply(q, R.const(0.5, "float32"))
            lv1: R.Tensor((2, 2, 8, 10), dtype="float32") = R.multiply(kt, R.const(0.5, "float32"))
            lv2: R.Tensor((2, 2, 10, 10), dtype="float32") = R.matmul(lv, lv1, out_dtype=None)
            lv3: R.Tensor((2, 2, 10, 10), dtype="float32") = R.add(lv2, mask)
            lv4: R.Tensor((2, 2, 10, 10), dtype="float32") = R.nn.softmax(lv3, axis=-1)
            lv5: R.Tensor((2, 2, 10, 10), dtype="bool") = R.isnan(lv4)
            lv6: R.Tensor((2, 2, 10, 10), dtype="float32") = R.where(lv5, R.const(0.0, "float32"), lv4)
            gv: R.Tensor((2, 2, 10, 8), dtype="float32") = R.matmul(lv6, v, out_dtype=None)
            R.output(gv)
        return gv

    @R.function
    def main(q: R.Tensor((2, 2, 10, 8), dtype="float32"), kt: R.Tensor((2, 2, 8, 10), dtype="float32"), mask: R.Tensor((2, 1, 10, 10), dtype="float32"), v: R.Tensor((2, 2, 10, 8), dtype="float32")) -> R.Tensor((2, 2, 10, 8), dtype="float32"):
        with R.dataflow():
            gv: R.Tensor((2, 2, 10, 8), dtype="float32") = Module.attn(q, kt, mask, v)
            R.output(gv)
        return gv
"#;

/// Runs `src`'s main as written and with every `Composite` attribute removed (interpreted).
fn fused_and_interpreted(src: &str, args: Vec<Value>) -> (Vec<f32>, Vec<f32>) {
    fused_and_interpreted_with(src, &[], args)
}

#[test]
fn the_attention_composite_runs_fused_and_agrees_with_its_body() {
    let m = fusebox_core::text::parse_module_str(ATTN).unwrap();
    let plan = crate::composite::recognise(m.get("attn").unwrap());
    assert!(
        matches!(&plan, Some(crate::composite::Plan::Attention { masks, .. }) if masks.len() == 1),
        "{plan:?}"
    );
    let mut r = Rng(21);
    let mask: Vec<f32> = (0..200)
        .map(|i| {
            if i % 10 >= 8 && i >= 100 {
                -3.4e38
            } else {
                0.0
            }
        })
        .collect();
    let args = vec![
        Value::Tensor(r.tensor(&[2, 2, 10, 8])),
        Value::Tensor(r.tensor(&[2, 2, 8, 10])),
        Value::Tensor(Tensor::from_f32(vec![2, 1, 10, 10], mask).unwrap()),
        Value::Tensor(r.tensor(&[2, 2, 10, 8])),
    ];
    let (fused, interp) = fused_and_interpreted(ATTN, args);
    close(&fused, &interp, 1e-5);
    // Not the same bits: the fused path really ran (online softmax in f32).
    assert_ne!(fused, interp);
}

/// The same attention with the heads' transposes inside (`cpu.attention_heads`): q, k, v as
/// `[B, S, H, D]`, the grouped key/value heads (3 query heads on 1), the output back to
/// `[B, S, H, D]`; the scale divides q only.
const ATTN_HEADS: &str = r#"@I.ir_module
class Module:
    @R.function(private=True)
    def attn(q: R.Tensor((2, 10, 3, 8), dtype="float32"), k: R.Tensor((2, 12, 1, 8), dtype="float32"), mask: R.Tensor((2, 1, 10, 12), dtype="float32"), v: R.Tensor((2, 12, 1, 8), dtype="float32")) -> R.Tensor((2, 10, 3, 8), dtype="float32"):
        R.func_attr({"Composite": "cpu.attention_heads", "Primitive": True})
        with R.dataflow():
            qh: R.Tensor((2, 3, 10, 8), dtype="float32") = R.permute_dims(q, axes=[0, 2, 1, 3])
            kh: R.Tensor((2, 1, 8, 12), dtype="float32") = R.permute_dims(k, axes=[0, 2, 3, 1])
            vh: R.Tensor((2, 1, 12, 8), dtype="float32") = R.permute_dims(v, axes=[0, 2, 1, 3])
            lv: R.Tensor((2, 3, 10, 8), dtype="float32") = R.divide(qh, R.const(2.0, "float32"))
            lv2: R.Tensor((2, 3, 10, 12), dtype="float32") = R.matmul(lv, kh, out_dtype=None)
            lv3: R.Tensor((2, 3, 10, 12), dtype="float32") = R.add(lv2, mask)
            lv4: R.Tensor((2, 3, 10, 12), dtype="float32") = R.nn.softmax(lv3, axis=-1)
            lv5: R.Tensor((2, 3, 10, 8), dtype="float32") = R.matmul(lv4, vh, out_dtype=None)
            gv: R.Tensor((2, 10, 3, 8), dtype="float32") = R.permute_dims(lv5, axes=[0, 2, 1, 3])
            R.output(gv)
        return gv

    @R.function
    def main(q: R.Tensor((2, 10, 3, 8), dtype="float32"), k: R.Tensor((2, 12, 1, 8), dtype="float32"), mask: R.Tensor((2, 1, 10, 12), dtype="float32"), v: R.Tensor((2, 12, 1, 8), dtype="float32")) -> R.Tensor((2, 10, 3, 8), dtype="float32"):
        with R.dataflow():
            gv: R.Tensor((2, 10, 3, 8), dtype="float32") = Module.attn(q, k, mask, v)
            R.output(gv)
        return gv
"#;

#[test]
fn the_heads_attention_composite_runs_fused_and_agrees_with_its_body() {
    let m = fusebox_core::text::parse_module_str(ATTN_HEADS).unwrap();
    let plan = crate::composite::recognise(m.get("attn").unwrap());
    let Some(crate::composite::Plan::Attention {
        perms, out_perm, ..
    }) = &plan
    else {
        panic!("{plan:?}")
    };
    assert_eq!(
        perms,
        &[
            Some(vec![0, 2, 1, 3]),
            Some(vec![0, 2, 3, 1]),
            Some(vec![0, 2, 1, 3])
        ]
    );
    assert_eq!(out_perm, &Some(vec![0, 2, 1, 3]));
    let mut r = Rng(23);
    let args = vec![
        Value::Tensor(r.tensor(&[2, 10, 3, 8])),
        Value::Tensor(r.tensor(&[2, 12, 1, 8])),
        Value::Tensor(r.tensor(&[2, 1, 10, 12])),
        Value::Tensor(r.tensor(&[2, 12, 1, 8])),
    ];
    let (fused, interp) = fused_and_interpreted(ATTN_HEADS, args);
    close(&fused, &interp, 1e-5);
    assert_ne!(fused, interp);
    // An output transpose that moves the last dim: recognised, but the kernel declines it
    // (its rows would not be runs) and the body is interpreted.
    let src = ATTN_HEADS
        .replace(
            "gv: R.Tensor((2, 10, 3, 8), dtype=\"float32\") = R.permute_dims(lv5, axes=[0, 2, 1, 3])",
            "gv: R.Tensor((2, 3, 8, 10), dtype=\"float32\") = R.permute_dims(lv5, axes=[0, 1, 3, 2])",
        )
        .replace(
            "-> R.Tensor((2, 10, 3, 8), dtype=\"float32\"):",
            "-> R.Tensor((2, 3, 8, 10), dtype=\"float32\"):",
        )
        .replace(
            "gv: R.Tensor((2, 10, 3, 8), dtype=\"float32\") = Module.attn",
            "gv: R.Tensor((2, 3, 8, 10), dtype=\"float32\") = Module.attn",
        );
    let m = fusebox_core::text::parse_module_str(&src).unwrap();
    assert!(crate::composite::recognise(m.get("attn").unwrap()).is_some());
    let args = vec![
        Value::Tensor(r.tensor(&[2, 10, 3, 8])),
        Value::Tensor(r.tensor(&[2, 12, 1, 8])),
        Value::Tensor(r.tensor(&[2, 1, 10, 12])),
        Value::Tensor(r.tensor(&[2, 12, 1, 8])),
    ];
    let (fused, interp) = fused_and_interpreted(&src, args);
    assert_eq!(fused, interp);
}

/// LongT5's local attention (`cpu.attention_einsum`): the scores and the product as einsums,
/// q `[B, N, S, H, D]` and k, v `[B, N, T, H, D]` by block, a position bias per block.
const ATTN_EINSUM: &str = r#"@I.ir_module
class Module:
    @R.function(private=True)
    def attn(q: R.Tensor((2, 3, 5, 2, 8), dtype="float32"), k: R.Tensor((2, 3, 7, 2, 8), dtype="float32"), bias: R.Tensor((1, 3, 2, 5, 7), dtype="float32"), v: R.Tensor((2, 3, 7, 2, 8), dtype="float32")) -> R.Tensor((2, 3, 5, 2, 8), dtype="float32"):
        R.func_attr({"Composite": "cpu.attention_einsum", "Primitive": True})
        with R.dataflow():
            lv: R.Tensor((2, 3, 2, 5, 7), dtype="float32") = R.einsum((q, k), subscripts="...qhd,...khd->...hqk")
            lv1: R.Tensor((2, 3, 2, 5, 7), dtype="float32") = R.add(lv, bias)
            lv2: R.Tensor((2, 3, 2, 5, 7), dtype="float32") = R.nn.softmax(lv1, axis=-1)
            gv: R.Tensor((2, 3, 5, 2, 8), dtype="float32") = R.einsum((lv2, v), subscripts="...hqk,...khd->...qhd")
            R.output(gv)
        return gv

    @R.function
    def main(q: R.Tensor((2, 3, 5, 2, 8), dtype="float32"), k: R.Tensor((2, 3, 7, 2, 8), dtype="float32"), bias: R.Tensor((1, 3, 2, 5, 7), dtype="float32"), v: R.Tensor((2, 3, 7, 2, 8), dtype="float32")) -> R.Tensor((2, 3, 5, 2, 8), dtype="float32"):
        with R.dataflow():
            gv: R.Tensor((2, 3, 5, 2, 8), dtype="float32") = Module.attn(q, k, bias, v)
            R.output(gv)
        return gv
"#;

#[test]
fn the_einsum_attention_composite_runs_fused_and_agrees_with_its_body() {
    let m = fusebox_core::text::parse_module_str(ATTN_EINSUM).unwrap();
    let plan = crate::composite::recognise(m.get("attn").unwrap());
    let Some(crate::composite::Plan::Attention {
        perms,
        out_perm,
        masks,
        ..
    }) = &plan
    else {
        panic!("{plan:?}")
    };
    // q as [.., H, S, D], k as kᵀ [.., H, D, T], v as [.., H, T, D], the result back.
    assert_eq!(
        perms,
        &[
            Some(vec![0, 1, 3, 2, 4]),
            Some(vec![0, 1, 3, 4, 2]),
            Some(vec![0, 1, 3, 2, 4])
        ]
    );
    assert_eq!(out_perm, &Some(vec![0, 1, 3, 2, 4]));
    assert_eq!(masks.len(), 1);
    let args = || {
        let mut r = Rng(41);
        vec![
            Value::Tensor(r.tensor(&[2, 3, 5, 2, 8])),
            Value::Tensor(r.tensor(&[2, 3, 7, 2, 8])),
            Value::Tensor(r.tensor(&[1, 3, 2, 5, 7])),
            Value::Tensor(r.tensor(&[2, 3, 7, 2, 8])),
        ]
    };
    let (fused, interp) = fused_and_interpreted(ATTN_EINSUM, args());
    close(&fused, &interp, 1e-5);
    // Not the same bits: the fused path really ran (the interpreter's einsum sums in f64).
    assert_ne!(fused, interp);
    // The operands the other way round (`k` first): the same scores, but not the form the
    // kernel takes (S must be the first operand's label); recognised as nothing, interpreted.
    let src = ATTN_EINSUM.replace(
        "R.einsum((q, k), subscripts=\"...qhd,...khd->...hqk\")",
        "R.einsum((k, q), subscripts=\"...khd,...qhd->...hqk\")",
    );
    assert_ne!(src, ATTN_EINSUM);
    let m = fusebox_core::text::parse_module_str(&src).unwrap();
    assert!(crate::composite::recognise(m.get("attn").unwrap()).is_none());
    let (fused, interp) = fused_and_interpreted(&src, args());
    assert_eq!(fused, interp);
}

#[test]
fn a_model_that_returns_its_keys_keeps_their_transpose_and_fuses_the_product_alone() {
    // `kh` (the keys' transpose) is also an output: `cpu.attention_heads` would leak it, so
    // its check declines and `cpu.attention` takes the product with the transposes outside.
    let src = r#"@I.ir_module
class Module:
    @R.function
    def main(q: R.Tensor((1, 6, 2, 8), dtype="float32"), k: R.Tensor((1, 6, 2, 8), dtype="float32"), v: R.Tensor((1, 6, 2, 8), dtype="float32")) -> R.Tuple(R.Tensor((1, 6, 2, 8), dtype="float32"), R.Tensor((1, 2, 8, 6), dtype="float32")):
        with R.dataflow():
            qh: R.Tensor((1, 2, 6, 8), dtype="float32") = R.permute_dims(q, axes=[0, 2, 1, 3])
            kh: R.Tensor((1, 2, 8, 6), dtype="float32") = R.permute_dims(k, axes=[0, 2, 3, 1])
            vh: R.Tensor((1, 2, 6, 8), dtype="float32") = R.permute_dims(v, axes=[0, 2, 1, 3])
            s: R.Tensor((1, 2, 6, 6), dtype="float32") = R.matmul(qh, kh, out_dtype=None)
            p: R.Tensor((1, 2, 6, 6), dtype="float32") = R.nn.softmax(s, axis=-1)
            o: R.Tensor((1, 2, 6, 8), dtype="float32") = R.matmul(p, vh, out_dtype=None)
            gv: R.Tensor((1, 6, 2, 8), dtype="float32") = R.permute_dims(o, axes=[0, 2, 1, 3])
            out: R.Tuple(R.Tensor((1, 6, 2, 8), dtype="float32"), R.Tensor((1, 2, 8, 6), dtype="float32")) = (gv, kh)
            R.output(out)
        return out
"#;
    let composites = |src: &str| -> Vec<String> {
        let m = fusebox_core::text::parse_module_str(src).unwrap();
        // In priority order, as every pipeline applies a table.
        let mut table = crate::backend::transformer_patterns().to_vec();
        fusebox_core::transform::sort_by_priority(&mut table);
        let opts = fusebox_core::transform::PartitionOptions::default();
        let out = fusebox_core::transform::fuse_ops_by_pattern(&m, &table, opts)
            .unwrap()
            .module;
        out.functions
            .values()
            .filter_map(|f| f.attrs.composite.clone())
            .collect()
    };
    assert_eq!(composites(src), ["cpu.attention"]);
    // Without the second output the transposes go inside.
    let single = src
        .replace(
            "            out: R.Tuple(R.Tensor((1, 6, 2, 8), dtype=\"float32\"), R.Tensor((1, 2, 8, 6), dtype=\"float32\")) = (gv, kh)\n            R.output(out)\n        return out",
            "            R.output(gv)\n        return gv",
        )
        .replace(
            "-> R.Tuple(R.Tensor((1, 6, 2, 8), dtype=\"float32\"), R.Tensor((1, 2, 8, 6), dtype=\"float32\")):",
            "-> R.Tensor((1, 6, 2, 8), dtype=\"float32\"):",
        );
    assert_eq!(composites(&single), ["cpu.attention_heads"]);
}

#[test]
fn a_body_of_another_form_is_interpreted() {
    // The scale is not a scalar: the recogniser declines, the body still runs.
    let src = ATTN.replace(
        "R.multiply(q, R.const(0.5, \"float32\"))",
        "R.multiply(q, q)",
    );
    let m = fusebox_core::text::parse_module_str(&src).unwrap();
    assert!(crate::composite::recognise(m.get("attn").unwrap()).is_none());
    let mut r = Rng(29);
    let args = vec![
        Value::Tensor(r.tensor(&[2, 2, 10, 8])),
        Value::Tensor(r.tensor(&[2, 2, 8, 10])),
        Value::Tensor(r.tensor(&[2, 1, 10, 10])),
        Value::Tensor(r.tensor(&[2, 2, 10, 8])),
    ];
    let (fused, interp) = fused_and_interpreted(&src, args);
    assert_eq!(fused, interp);
    // An extra binding in the body.
    let src = ATTN.replace(
        "            gv: R.Tensor((2, 2, 10, 8), dtype=\"float32\") = R.matmul(lv6, v, out_dtype=None)\n",
        "            lv7: R.Tensor((2, 2, 10, 10), dtype=\"float32\") = R.nn.relu(lv6)\n            gv: R.Tensor((2, 2, 10, 8), dtype=\"float32\") = R.matmul(lv7, v, out_dtype=None)\n",
    );
    let m = fusebox_core::text::parse_module_str(&src).unwrap();
    assert!(crate::composite::recognise(m.get("attn").unwrap()).is_none());
}

const RLN: &str = r#"@I.ir_module
class Module:
    @R.function(private=True)
    def rln(a: R.Tensor((6, 16), dtype="float32"), b: R.Tensor((6, 16), dtype="float32"), g: R.Tensor((16,), dtype="float32"), be: R.Tensor((16,), dtype="float32")) -> R.Tuple(R.Tensor((6, 16), dtype="float32"), R.Tensor((6, 16), dtype="float32")):
        R.func_attr({"Composite": "cpu.residual_layer_norm", "Primitive": True})
        with R.dataflow():
            s: R.Tensor((6, 16), dtype="float32") = R.add(a, b)
            y: R.Tensor((6, 16), dtype="float32") = R.nn.layer_norm(s, g, be, axes=[-1], epsilon=1e-05, center=True, scale=True)
            gv: R.Tuple(R.Tensor((6, 16), dtype="float32"), R.Tensor((6, 16), dtype="float32")) = (y, s)
            R.output(gv)
        return gv

    @R.function
    def main(a: R.Tensor((6, 16), dtype="float32"), b: R.Tensor((6, 16), dtype="float32"), g: R.Tensor((16,), dtype="float32"), be: R.Tensor((16,), dtype="float32")) -> R.Tuple(R.Tensor((6, 16), dtype="float32"), R.Tensor((6, 16), dtype="float32")):
        with R.dataflow():
            gv: R.Tuple(R.Tensor((6, 16), dtype="float32"), R.Tensor((6, 16), dtype="float32")) = Module.rln(a, b, g, be)
            R.output(gv)
        return gv
"#;

#[test]
fn the_residual_layer_norm_composite_returns_both_outputs_bit_for_bit() {
    let m = fusebox_core::text::parse_module_str(RLN).unwrap();
    let plan = crate::composite::recognise(m.get("rln").unwrap());
    assert!(
        matches!(&plan, Some(crate::composite::Plan::ResidualLayerNorm { outputs, .. }) if outputs == &[true, false]),
        "{plan:?}"
    );
    let mut r = Rng(23);
    let args = ["a", "b", "g", "be"]
        .iter()
        .zip([&[6usize, 16][..], &[6, 16], &[16], &[16]])
        .map(|(_, s)| Value::Tensor(r.tensor(s)))
        .collect();
    let (fused, interp) = fused_and_interpreted(RLN, args);
    assert_eq!(fused, interp);
}

#[test]
fn the_f32_erf_is_within_a_few_ulps_of_the_f64_one() {
    let mut worst = 0.0f64;
    for i in -60_000..=60_000 {
        let x = i as f32 * 1e-4;
        let got = f64::from(crate::norm::erf32(x));
        let want = crate::elementwise::erf64(f64::from(x));
        worst = worst.max((got - want).abs());
    }
    assert!(worst < 5e-7, "worst |erf32 - erf64| = {worst:e}");
    // Saturates (within one ulp of ±1) far out.
    assert!((crate::norm::erf32(10.0) - 1.0).abs() <= f32::EPSILON);
    assert!((crate::norm::erf32(-1e30) + 1.0).abs() <= f32::EPSILON);
    assert!(crate::norm::erf32(f32::NAN).is_nan());
    assert_eq!(crate::norm::erf32(0.0), 0.0);
}

#[test]
fn the_f32_exp_is_within_two_ulps_of_std() {
    let mut worst = 0.0f32;
    for i in -873_000..=883_000 {
        let x = i as f32 * 1e-4;
        let (got, want) = (crate::attention::exp32(x), x.exp());
        if want >= f32::MIN_POSITIVE {
            worst = worst.max(((got - want) / want).abs());
        }
    }
    assert!(worst < 2.5 * f32::EPSILON, "worst relative error {worst:e}");
    assert_eq!(crate::attention::exp32(f32::NEG_INFINITY), 0.0);
    assert_eq!(crate::attention::exp32(-1e30), 0.0);
    assert!(crate::attention::exp32(f32::NAN).is_nan());
    assert_eq!(crate::attention::exp32(0.0), 1.0);
}

#[test]
fn the_f32_exp_takes_2_to_the_n_from_bits_as_the_integer_conversion_gave_it() {
    // exp32 reads n out of the rounding sum's bits; before, it converted n to an integer.
    // The scale is the same, so every result keeps its bits.
    let by_conversion = |x: f32| {
        const MAGIC: f32 = 12_582_912.0;
        let xc = x.clamp(-87.3, 88.3);
        let n = (xc * std::f32::consts::LOG2_E + MAGIC) - MAGIC;
        let r = xc - n * 0.693_359_4 - n * -2.121_944_4e-4;
        let mut y = 1.987_569_1e-4_f32;
        y = y * r + 1.398_2e-3;
        y = y * r + 8.333_452e-3;
        y = y * r + 4.166_579_6e-2;
        y = y * r + 0.166_666_65;
        y = y * r + 0.5;
        y = y * r * r + r + 1.0;
        let scale = f32::from_bits(((n as i32 + 127) as u32) << 23);
        if x < -87.3 { 0.0 } else { y * scale }
    };
    let specials = [
        f32::MAX,
        f32::MIN,
        f32::INFINITY,
        88.3,
        -87.3,
        88.29,
        -87.29,
        -0.0,
    ];
    for x in (-900_000..=900_000)
        .map(|i| i as f32 * 1e-4)
        .chain(specials)
    {
        let (got, want) = (crate::attention::exp32(x), by_conversion(x));
        assert_eq!(got.to_bits(), want.to_bits(), "exp32({x})");
    }
}

#[test]
fn tanh32_is_within_2e7_of_tanh() {
    let mut worst = 0.0f64;
    for i in -200_000..=200_000 {
        let y = i as f32 / 10_000.0;
        let err = (f64::from(crate::norm::tanh32(y)) - f64::from(y).tanh()).abs();
        worst = worst.max(err);
    }
    assert!(worst < 2e-7, "worst |tanh32 - tanh| = {worst:e}");
    assert!(crate::norm::tanh32(f32::NAN).is_nan());
    assert_eq!(crate::norm::tanh32(f32::INFINITY), 1.0);
}

const SWIGLU: &str = r#"@I.ir_module
class Module:
    @R.function(private=True)
    def mlp(x: R.Tensor((2, 9, 24), dtype="float32")) -> R.Tensor((2, 9, 40), dtype="float32"):
        R.func_attr({"Composite": "cpu.silu_gated", "Primitive": True})
        with R.dataflow():
            g: R.Tensor((2, 9, 40), dtype="float32") = R.matmul(x, metadata["relax.expr.Constant"][0], out_dtype=None)
            s: R.Tensor((2, 9, 40), dtype="float32") = R.sigmoid(g)
            a: R.Tensor((2, 9, 40), dtype="float32") = R.multiply(g, s)
            u: R.Tensor((2, 9, 40), dtype="float32") = R.matmul(x, metadata["relax.expr.Constant"][1], out_dtype=None)
            gv: R.Tensor((2, 9, 40), dtype="float32") = R.multiply(a, u)
            R.output(gv)
        return gv

    @R.function
    def main(x: R.Tensor((2, 9, 24), dtype="float32")) -> R.Tensor((2, 9, 40), dtype="float32"):
        with R.dataflow():
            gv: R.Tensor((2, 9, 40), dtype="float32") = Module.mlp(x)
            R.output(gv)
        return gv
"#;

/// `t` as a constant of the text format.
fn constant(t: &Tensor) -> fusebox_core::ir::Constant {
    let bytes = t
        .to_f32_vec()
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let shape = t.shape().iter().map(|&d| d as i64).collect();
    fusebox_core::ir::Constant::from_bytes(fusebox_core::ir::DType::F32, shape, bytes).unwrap()
}

/// A constant table holding `consts` as `metadata["relax.expr.Constant"][i]`.
fn table(consts: &[Tensor]) -> fusebox_core::text::ConstTable {
    let mut table = fusebox_core::text::ConstTable::new();
    for (i, c) in consts.iter().enumerate() {
        table.insert("relax.expr.Constant", i, constant(c));
    }
    table
}

/// [`fused_and_interpreted`] with `src`'s constants from `consts`: both results, tuples
/// flattened.
fn fused_and_interpreted_with(
    src: &str,
    consts: &[Tensor],
    args: Vec<Value>,
) -> (Vec<f32>, Vec<f32>) {
    let table = table(consts);
    let parse = |s: &str| fusebox_core::text::parse_module(s, "test.relax", &table).unwrap();
    // Every `"Composite": "...", ` attribute removed.
    let mut plain_src = src.to_string();
    while let Some(at) = plain_src.find("\"Composite\": \"") {
        let end = plain_src[at..].find("\", ").unwrap() + at + 3;
        plain_src.replace_range(at..end, "");
    }
    let flat = |v: Value| match v {
        Value::Tensor(t) => t.to_f32_vec(),
        Value::Tuple(ts) => ts
            .into_iter()
            .flat_map(|t| match t {
                Value::Tensor(t) => t.to_f32_vec(),
                _ => panic!("not a tensor"),
            })
            .collect(),
        _ => panic!("not a tensor"),
    };
    let fused = crate::run(&parse(src), "main", args.clone()).unwrap();
    let interp = crate::run(&parse(&plain_src), "main", args).unwrap();
    (flat(fused), flat(interp))
}

/// The bits of `v`, to compare results NaN and all.
fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn the_silu_gated_composite_runs_fused_bit_for_bit_with_its_body() {
    let mut r = Rng(31);
    let consts = [r.tensor(&[24, 40]), r.tensor(&[24, 40])];
    let m = fusebox_core::text::parse_module(SWIGLU, "test.relax", &table(&consts)).unwrap();
    let plan = crate::composite::recognise(m.get("mlp").unwrap());
    assert!(
        matches!(plan, Some(crate::composite::Plan::SiluGated { .. })),
        "{plan:?}"
    );
    for threads in [1, 2, 3] {
        let args = vec![Value::Tensor(r.tensor(&[2, 9, 24]))];
        let (fused, interp) = crate::par::with_threads(threads, || {
            fused_and_interpreted_with(SWIGLU, &consts, args.clone())
        });
        assert_eq!(bits(&fused), bits(&interp), "{threads} threads");
    }
    // The other operand orders are recognised too.
    let swapped = SWIGLU
        .replace("R.multiply(g, s)", "R.multiply(s, g)")
        .replace("R.multiply(a, u)", "R.multiply(u, a)");
    let args = vec![Value::Tensor(r.tensor(&[2, 9, 24]))];
    let (fused, interp) = fused_and_interpreted_with(&swapped, &consts, args);
    assert_eq!(bits(&fused), bits(&interp));
    // Two different inputs to the projections: not this form, interpreted.
    let two = SWIGLU
        .replace(
            "def mlp(x: R.Tensor((2, 9, 24), dtype=\"float32\"))",
            "def mlp(x: R.Tensor((2, 9, 24), dtype=\"float32\"), y: R.Tensor((2, 9, 24), dtype=\"float32\"))",
        )
        .replace(
            "R.matmul(x, metadata[\"relax.expr.Constant\"][1]",
            "R.matmul(y, metadata[\"relax.expr.Constant\"][1]",
        );
    let m = fusebox_core::text::parse_module(
        &two.replace("Module.mlp(x)", "Module.mlp(x, x)"),
        "t.relax",
        &table(&consts),
    )
    .unwrap();
    assert!(crate::composite::recognise(m.get("mlp").unwrap()).is_none());
}

#[test]
fn silu_gated_matches_its_definition() {
    let mut r = Rng(37);
    let (m, k, n) = (5usize, 33usize, 70usize);
    let (x, wg, wu) = (r.tensor(&[m, k]), r.tensor(&[k, n]), r.tensor(&[k, n]));
    let order = crate::dense::GateOrder {
        gate_first: true,
        silu_first: true,
    };
    let got = crate::dense::silu_gated(&x, &wg, &wu, order, (None, None))
        .unwrap()
        .unwrap();
    let (xd, gd, ud) = (x.to_f32_vec(), wg.to_f32_vec(), wu.to_f32_vec());
    let mut want = Vec::new();
    for i in 0..m {
        for j in 0..n {
            let dot = |w: &[f32]| -> f64 {
                (0..k)
                    .map(|p| f64::from(xd[i * k + p]) * f64::from(w[p * n + j]))
                    .sum()
            };
            let (g, u) = (dot(&gd), dot(&ud));
            want.push((g / (1.0 + (-g).exp()) * u) as f32);
        }
    }
    assert_eq!(got.shape(), &[m, n]);
    close(&got.to_f32_vec(), &want, 1e-5);
}

const ROPE: &str = r#"@I.ir_module
class Module:
    @R.function(private=True)
    def rope(x: R.Tensor((2, 3, 7, 16), dtype="float32"), cos: R.Tensor((1, 1, 7, 16), dtype="float32"), sin: R.Tensor((1, 1, 7, 16), dtype="float32")) -> R.Tensor((2, 3, 7, 16), dtype="float32"):
        R.func_attr({"Composite": "cpu.rope", "Primitive": True})
        with R.dataflow():
            a: R.Tensor((2, 3, 7, 16), dtype="float32") = R.multiply(x, cos)
            s1: R.Tensor((2, 3, 7, 8), dtype="float32") = R.strided_slice(x, axes=[3], begin=[0], end=[8], strides=[1], assume_inbound=False)
            s2: R.Tensor((2, 3, 7, 8), dtype="float32") = R.strided_slice(x, axes=[3], begin=[8], end=[9223372036854775807], strides=[1], assume_inbound=False)
            n: R.Tensor((2, 3, 7, 8), dtype="float32") = R.negative(s2)
            c: R.Tensor((2, 3, 7, 16), dtype="float32") = R.concat((n, s1), axis=-1)
            b: R.Tensor((2, 3, 7, 16), dtype="float32") = R.multiply(c, sin)
            gv: R.Tensor((2, 3, 7, 16), dtype="float32") = R.add(a, b)
            R.output(gv)
        return gv

    @R.function
    def main(x: R.Tensor((2, 3, 7, 16), dtype="float32"), cos: R.Tensor((1, 1, 7, 16), dtype="float32"), sin: R.Tensor((1, 1, 7, 16), dtype="float32")) -> R.Tensor((2, 3, 7, 16), dtype="float32"):
        with R.dataflow():
            gv: R.Tensor((2, 3, 7, 16), dtype="float32") = Module.rope(x, cos, sin)
            R.output(gv)
        return gv
"#;

#[test]
fn the_rope_composite_runs_fused_bit_for_bit_with_its_body() {
    let mut r = Rng(41);
    let args = |r: &mut Rng| {
        vec![
            Value::Tensor(r.tensor(&[2, 3, 7, 16])),
            Value::Tensor(r.tensor(&[1, 1, 7, 16])),
            Value::Tensor(r.tensor(&[1, 1, 7, 16])),
        ]
    };
    let variants = [
        ROPE.to_string(),
        // The other operand orders; and the slices' axis written as -1.
        ROPE.replace("R.multiply(x, cos)", "R.multiply(cos, x)")
            .replace("R.multiply(c, sin)", "R.multiply(sin, c)")
            .replace("R.add(a, b)", "R.add(b, a)")
            .replace("axes=[3]", "axes=[-1]"),
    ];
    for src in &variants {
        let m = fusebox_core::text::parse_module_str(src).unwrap();
        let plan = crate::composite::recognise(m.get("rope").unwrap());
        assert!(
            matches!(plan, Some(crate::composite::Plan::Rope { half: 8, .. })),
            "{plan:?}"
        );
        let (fused, interp) = fused_and_interpreted(src, args(&mut r));
        assert_eq!(bits(&fused), bits(&interp));
    }
    // Slices that do not halve the last axis (a rotary part of 8 of 16): the kernel declines
    // at run time, and the caller interprets the body.
    let plan = crate::composite::Plan::Rope {
        x: crate::composite::Leaf::Param(0),
        cos: crate::composite::Leaf::Param(1),
        sin: crate::composite::Leaf::Param(2),
        half: 4,
        end: 8,
        axes: [3, -1],
        order: crate::rope::RopeOrder {
            x_first: true,
            rotated_first: true,
            cos_first: true,
        },
    };
    let vals = args(&mut r);
    let input = |l: crate::composite::Leaf| match l {
        crate::composite::Leaf::Param(i) => Ok(vals[i].clone()),
        crate::composite::Leaf::Const(_) => panic!("no constants"),
    };
    assert!(
        crate::composite::run(&plan, &input, &|_, _| None)
            .unwrap()
            .is_none()
    );
    let crate::composite::Plan::Rope {
        x, cos, sin, order, ..
    } = plan
    else {
        unreachable!()
    };
    let halves = crate::composite::Plan::Rope {
        x,
        cos,
        sin,
        half: 8,
        end: i64::MAX,
        axes: [3, -1],
        order,
    };
    assert!(
        crate::composite::run(&halves, &input, &|_, _| None)
            .unwrap()
            .is_some()
    );
}

const LN_DECOMPOSED: &str = r#"@I.ir_module
class Module:
    @R.function(private=True)
    def ln(x: R.Tensor((3, 5, 24), dtype="float32")) -> R.Tensor((3, 5, 24), dtype="float32"):
        R.func_attr({"Composite": "cpu.layer_norm_decomposed", "Primitive": True})
        with R.dataflow():
            m: R.Tensor((3, 5, 1), dtype="float32") = R.mean(x, axis=[-1], keepdims=True)
            d: R.Tensor((3, 5, 24), dtype="float32") = R.subtract(x, m)
            p: R.Tensor((3, 5, 24), dtype="float32") = R.power(d, R.const(2.0, "float32"))
            v: R.Tensor((3, 5, 1), dtype="float32") = R.mean(p, axis=[-1], keepdims=True)
            a: R.Tensor((3, 5, 1), dtype="float32") = R.add(v, R.const(9.9999997e-06, "float32"))
            s: R.Tensor((3, 5, 1), dtype="float32") = R.sqrt(a)
            n: R.Tensor((3, 5, 24), dtype="float32") = R.divide(d, s)
            g: R.Tensor((3, 5, 24), dtype="float32") = R.multiply(n, metadata["relax.expr.Constant"][0])
            gv: R.Tensor((3, 5, 24), dtype="float32") = R.add(g, metadata["relax.expr.Constant"][1])
            R.output(gv)
        return gv

    @R.function
    def main(x: R.Tensor((3, 5, 24), dtype="float32")) -> R.Tensor((3, 5, 24), dtype="float32"):
        with R.dataflow():
            gv: R.Tensor((3, 5, 24), dtype="float32") = Module.ln(x)
            R.output(gv)
        return gv
"#;

#[test]
fn the_decomposed_layer_norm_runs_fused_bit_for_bit_with_its_body() {
    let mut r = Rng(43);
    let consts = [r.tensor(&[24]), r.tensor(&[24])];
    let without_affine = LN_DECOMPOSED
        .replace(
            "            g: R.Tensor((3, 5, 24), dtype=\"float32\") = R.multiply(n, metadata[\"relax.expr.Constant\"][0])\n            gv: R.Tensor((3, 5, 24), dtype=\"float32\") = R.add(g, metadata[\"relax.expr.Constant\"][1])\n",
            "            gv: R.Tensor((3, 5, 24), dtype=\"float32\") = R.divide(d, s)\n",
        )
        .replace(
            "            n: R.Tensor((3, 5, 24), dtype=\"float32\") = R.divide(d, s)\n",
            "",
        );
    for (src, affine) in [(LN_DECOMPOSED.to_string(), true), (without_affine, false)] {
        let m = fusebox_core::text::parse_module(&src, "t.relax", &table(&consts)).unwrap();
        let plan = crate::composite::recognise(m.get("ln").unwrap());
        assert!(
            matches!(&plan, Some(crate::composite::Plan::LayerNormDecomposed { gamma, beta, exp, .. })
                if gamma.is_some() == affine && beta.is_some() == affine && *exp == 2.0),
            "{plan:?}"
        );
        // Rows with a large offset (the mean matters) and a NaN row.
        let mut x = r.tensor(&[3, 5, 24]).to_f32_vec();
        x.iter_mut()
            .enumerate()
            .for_each(|(i, v)| *v += (i / 24) as f32 * 100.0);
        x[30] = f32::NAN;
        let x = Tensor::from_f32(vec![3, 5, 24], x).unwrap();
        for threads in [1, 2] {
            let (fused, interp) = crate::par::with_threads(threads, || {
                fused_and_interpreted_with(&src, &consts, vec![Value::Tensor(x.clone())])
            });
            assert_eq!(
                bits(&fused),
                bits(&interp),
                "affine {affine}, {threads} threads"
            );
        }
    }
    // Against the definition (f64): mean, variance, normalise, scale and shift.
    let x = r.tensor(&[4, 24]);
    let (g, b) = (&consts[0], &consts[1]);
    let got = crate::norm::layer_norm_decomposed(&x, 2.0, 1e-5, Some(g), Some(b))
        .unwrap()
        .unwrap()
        .to_f32_vec();
    let (xd, gd, bd) = (x.to_f32_vec(), g.to_f32_vec(), b.to_f32_vec());
    let mut want = Vec::new();
    for row in xd.chunks(24) {
        let m = row.iter().map(|&v| f64::from(v)).sum::<f64>() / 24.0;
        let var = row.iter().map(|&v| (f64::from(v) - m).powi(2)).sum::<f64>() / 24.0;
        for (j, &v) in row.iter().enumerate() {
            let y = (f64::from(v) - m) / (var + 1e-5).sqrt();
            want.push((y * f64::from(gd[j]) + f64::from(bd[j])) as f32);
        }
    }
    close(&got, &want, 1e-5);
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

#[test]
fn the_f32_sigmoid_is_within_three_ulps_of_its_f64_definition() {
    // sigmoid32 reads e^-x from exp32; against 1 / (1 + e^-x) in f64, relative where the
    // result is a normal float, and the ends: 0 below -88.3 (where expf overflows from
    // -88.73, a denormal between), 1 at +inf, NaN through.
    let mut worst = 0.0f64;
    for i in -880_000..=880_000 {
        let x = i as f32 * 1e-4;
        let want = 1.0 / (1.0 + (-f64::from(x)).exp());
        let got = f64::from(crate::elementwise::sigmoid32(x));
        if want >= f64::from(f32::MIN_POSITIVE) {
            worst = worst.max(((got - want) / want).abs());
        } else {
            assert!(
                (got - want).abs() <= 5e-39,
                "sigmoid32({x}) = {got:e}, want {want:e}"
            );
        }
    }
    assert!(
        worst < 3.0 * f64::from(f32::EPSILON),
        "worst relative error {worst:e}"
    );
    let s = crate::elementwise::sigmoid32;
    assert_eq!(s(f32::NEG_INFINITY), 0.0);
    assert_eq!(s(-1e30), 0.0);
    assert_eq!(s(f32::INFINITY), 1.0);
    assert_eq!(s(0.0), 0.5);
    assert!(s(f32::NAN).is_nan());
}

/// Grouped-query attention with Hugging Face's `repeat_kv` inside (`cpu.attention_grouped`):
/// 6 query heads on 2 key/value heads, each repeated 3 times by expand_dims, broadcast_to and
/// reshape (kᵀ then transposed), with the exporters' targets as shape parameters. `BATCH`
/// is the broadcast target's batch (the q, mask and result batch follow it).
const ATTN_GROUPED: &str = r#"@I.ir_module
class Module:
    @R.function(private=True)
    def attn(q: R.Tensor((BATCH, 6, 5, 8), dtype="float32"), k: R.Tensor((1, 2, 5, 8), dtype="float32"), mask: R.Tensor((1, 1, 5, 5), dtype="float32"), v: R.Tensor((1, 2, 5, 8), dtype="float32"), b: R.Shape([BATCH, 2, 3, 5, 8]), s: R.Shape([BATCH, 6, 5, 8])) -> R.Tensor((BATCH, 6, 5, 8), dtype="float32"):
        R.func_attr({"Composite": "cpu.attention_grouped", "Primitive": True})
        with R.dataflow():
            ke: R.Tensor((1, 2, 1, 5, 8), dtype="float32") = R.expand_dims(k, axis=[2])
            kb: R.Tensor((BATCH, 2, 3, 5, 8), dtype="float32") = R.broadcast_to(ke, b)
            kr: R.Tensor((BATCH, 6, 5, 8), dtype="float32") = R.reshape(kb, s)
            kt: R.Tensor((BATCH, 6, 8, 5), dtype="float32") = R.permute_dims(kr, axes=[0, 1, 3, 2])
            ve: R.Tensor((1, 2, 1, 5, 8), dtype="float32") = R.expand_dims(v, axis=[2])
            vb: R.Tensor((BATCH, 2, 3, 5, 8), dtype="float32") = R.broadcast_to(ve, b)
            vr: R.Tensor((BATCH, 6, 5, 8), dtype="float32") = R.reshape(vb, s)
            lv: R.Tensor((BATCH, 6, 5, 8), dtype="float32") = R.multiply(q, R.const(0.5, "float32"))
            lv1: R.Tensor((BATCH, 6, 8, 5), dtype="float32") = R.multiply(kt, R.const(0.5, "float32"))
            lv2: R.Tensor((BATCH, 6, 5, 5), dtype="float32") = R.matmul(lv, lv1, out_dtype=None)
            lv3: R.Tensor((BATCH, 6, 5, 5), dtype="float32") = R.add(lv2, mask)
            lv4: R.Tensor((BATCH, 6, 5, 5), dtype="float32") = R.nn.softmax(lv3, axis=-1)
            gv: R.Tensor((BATCH, 6, 5, 8), dtype="float32") = R.matmul(lv4, vr, out_dtype=None)
            R.output(gv)
        return gv

    @R.function
    def main(q: R.Tensor((BATCH, 6, 5, 8), dtype="float32"), k: R.Tensor((1, 2, 5, 8), dtype="float32"), mask: R.Tensor((1, 1, 5, 5), dtype="float32"), v: R.Tensor((1, 2, 5, 8), dtype="float32")) -> R.Tensor((BATCH, 6, 5, 8), dtype="float32"):
        with R.dataflow():
            gv: R.Tensor((BATCH, 6, 5, 8), dtype="float32") = Module.attn(q, k, mask, v, R.shape([BATCH, 2, 3, 5, 8]), R.shape([BATCH, 6, 5, 8]))
            R.output(gv)
        return gv
"#;

#[test]
fn the_grouped_attention_composite_reads_the_repeated_heads_in_place() {
    let src = ATTN_GROUPED.replace("BATCH", "1");
    let m = fusebox_core::text::parse_module_str(&src).unwrap();
    let plan = crate::composite::recognise(m.get("attn").unwrap());
    let Some(crate::composite::Plan::Attention { perms, repeats, .. }) = &plan else {
        panic!("{plan:?}")
    };
    assert!(repeats.iter().all(Option::is_some), "{plan:?}");
    assert_eq!(perms, &[None, Some(vec![0, 1, 3, 2]), None]);
    let mut r = Rng(41);
    let args = |r: &mut Rng, batch: usize| {
        vec![
            Value::Tensor(r.tensor(&[batch, 6, 5, 8])),
            Value::Tensor(r.tensor(&[1, 2, 5, 8])),
            Value::Tensor(r.tensor(&[1, 1, 5, 5])),
            Value::Tensor(r.tensor(&[1, 2, 5, 8])),
        ]
    };
    let (fused, interp) = fused_and_interpreted(&src, args(&mut r, 1));
    close(&fused, &interp, 1e-5);
    // Not the same bits: the kernel ran, on the 2 heads (the op-by-op body copies them to 6).
    assert_ne!(bits(&fused), bits(&interp));
    // A broadcast that also widens the batch (1 → 2) is not the heads' repeat alone: the
    // targets do not fit at run time and the body runs op by op, the same bits.
    let src = ATTN_GROUPED.replace("BATCH", "2");
    let (fused, interp) = fused_and_interpreted(&src, args(&mut r, 2));
    assert_eq!(bits(&fused), bits(&interp));
    // The new axis counted from the end is the same repeat.
    let src = ATTN_GROUPED
        .replace("BATCH", "1")
        .replace("axis=[2]", "axis=[-3]");
    let m = fusebox_core::text::parse_module_str(&src).unwrap();
    assert!(crate::composite::recognise(m.get("attn").unwrap()).is_some());
    // A repeat with the new axis before the heads interleaves them (head h reads h % 2, not
    // h / 3): not recognised, and run op by op.
    let odd = ATTN_GROUPED
        .replace("BATCH", "1")
        .replace("R.expand_dims(k, axis=[2])", "R.expand_dims(k, axis=[1])")
        .replace(
            "ke: R.Tensor((1, 2, 1, 5, 8)",
            "ke: R.Tensor((1, 1, 2, 5, 8)",
        )
        .replace(
            "kb: R.Tensor((1, 2, 3, 5, 8)",
            "kb: R.Tensor((1, 3, 2, 5, 8)",
        )
        .replace("R.broadcast_to(ke, b)", "R.broadcast_to(ke, b2)")
        .replace(
            "b: R.Shape([1, 2, 3, 5, 8]),",
            "b: R.Shape([1, 2, 3, 5, 8]), b2: R.Shape([1, 3, 2, 5, 8]),",
        )
        .replace(
            "R.shape([1, 2, 3, 5, 8]), R.shape([1, 6, 5, 8]))",
            "R.shape([1, 2, 3, 5, 8]), R.shape([1, 3, 2, 5, 8]), R.shape([1, 6, 5, 8]))",
        );
    let m = fusebox_core::text::parse_module_str(&odd).unwrap();
    assert!(crate::composite::recognise(m.get("attn").unwrap()).is_none());
    let (fused, interp) = fused_and_interpreted(&odd, args(&mut r, 1));
    assert_eq!(bits(&fused), bits(&interp));
    // The dynamo export's keys: the transpose between the broadcast and the reshape (of the
    // transposed shape), read as the keys transposed by [0, 1, 3, 2].
    let dynamo = ATTN_GROUPED
        .replace("BATCH", "1")
        .replace(
            "kr: R.Tensor((1, 6, 5, 8), dtype=\"float32\") = R.reshape(kb, s)",
            "kp: R.Tensor((1, 2, 3, 8, 5), dtype=\"float32\") = R.permute_dims(kb, axes=[0, 1, 2, 4, 3])",
        )
        .replace(
            "kt: R.Tensor((1, 6, 8, 5), dtype=\"float32\") = R.permute_dims(kr, axes=[0, 1, 3, 2])",
            "kt: R.Tensor((1, 6, 8, 5), dtype=\"float32\") = R.reshape(kp, s2)",
        )
        .replace(
            "s: R.Shape([1, 6, 5, 8])) ->",
            "s: R.Shape([1, 6, 5, 8]), s2: R.Shape([1, 6, 8, 5])) ->",
        )
        .replace(
            "R.shape([1, 6, 5, 8]))",
            "R.shape([1, 6, 5, 8]), R.shape([1, 6, 8, 5]))",
        );
    let m = fusebox_core::text::parse_module_str(&dynamo).unwrap();
    let plan = crate::composite::recognise(m.get("attn").unwrap());
    let Some(crate::composite::Plan::Attention { perms, repeats, .. }) = &plan else {
        panic!("{plan:?}")
    };
    assert!(repeats.iter().all(Option::is_some), "{plan:?}");
    assert_eq!(perms, &[None, Some(vec![0, 1, 3, 2]), None]);
    let (fused, interp) = fused_and_interpreted(&dynamo, args(&mut r, 1));
    close(&fused, &interp, 1e-5);
    assert_ne!(bits(&fused), bits(&interp));
}
