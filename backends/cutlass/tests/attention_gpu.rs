//! GPU numerics of the fused attention kernel against a naive reference written here,
//! independently of the kernel: the score matrix materialised in f64, TVM's definition of
//! `R.nn.attention` (scale, then bias, then the causal mask `j <= i + offset` with offset 0
//! for TopLeft and `|seq_q - seq_kv|` for BottomRight, softmax over keys, times V), on the
//! same f16/bf16-rounded inputs the kernel reads.
//!
//! Cases: batch 2; sequence lengths 1, 17, 127, 300 (none a multiple of the 64-row tile but
//! through 300), equal and unequal query/key lengths; head_dim 64 and 128 (and 32, 80 once);
//! no mask, TopLeft, BottomRight; no bias, a full (batch, heads, seq_q, seq_kv) bias, a
//! broadcast (1, heads, 1, seq_kv) bias and a (seq_q, seq_kv) bias; equal heads, grouped-query
//! heads (4 query heads per key/value head) and multi-query (4 to 1); an explicit scale;
//! float16 and bfloat16; and a few in the (batch, heads, seq, head_dim) layout.
//!
//! Tolerance: the inputs are uniform in [-1, 1], so every output lies in [-1, 1]; the kernel
//! rounds P to the element type before the P·V MMA (relative error ≤ 2⁻¹¹ for float16, 2⁻⁸ for
//! bfloat16, at most that relative error of the output) and rounds the output (≤ 2⁻¹² resp.
//! 2⁻⁹ absolute below 1); the f32 accumulation adds far less. Allowed max absolute error:
//! 2e-3 for float16, 1.2e-2 for bfloat16 (about 2× those bounds), and no NaN.
//!
//! Without a device the test is skipped with the reason; `FUSEBOX_REQUIRE_GPU=1` turns the
//! skip into a failure.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failure is a panic"
)]

use fusebox_core::ir::DType;
use fusebox_core::runtime::{Storage, Tensor};
use fusebox_cuda::GpuTensor;
use fusebox_cuda::testing as common;
use fusebox_cutlass::attention::{AttentionOptions, CausalMask, FlashAttention, Layout};

/// Uniform in [-amp, amp], rounded to `dtype`; returns the tensor and its exact values.
fn input(dtype: DType, shape: &[usize], seed: u64, amp: f64) -> (Tensor, Vec<f64>) {
    let n: usize = shape.iter().product();
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let v: Vec<f64> = (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (((s >> 33) as f64) / ((1u64 << 31) as f64) * 2.0 - 1.0) * amp
        })
        .collect();
    let t = Tensor::new(shape.to_vec(), Storage::from_f64(dtype, v)).unwrap();
    let exact = t.to_f64_vec();
    (t, exact)
}

/// Attention sizes.
#[derive(Clone, Copy, Debug)]
struct Dims {
    batch: usize,
    seq_q: usize,
    seq_kv: usize,
    heads_q: usize,
    heads_kv: usize,
    d: usize,
}

/// The naive reference: materialised scores in f64, softmax, times V (BSNH in and out).
/// `bias` is given with its shape, broadcast here by numpy rules to (b, h, i, j).
fn reference(
    dm: Dims,
    q: &[f64],
    k: &[f64],
    v: &[f64],
    bias: Option<(&[usize], &[f64])>,
    scale: f64,
    causal: Option<CausalMask>,
) -> Vec<f64> {
    let Dims {
        batch,
        seq_q,
        seq_kv,
        heads_q,
        heads_kv,
        d,
    } = dm;
    let group = heads_q / heads_kv;
    let offset = match causal {
        None => None,
        Some(CausalMask::TopLeft) => Some(0usize),
        Some(CausalMask::BottomRight) => Some(seq_q.abs_diff(seq_kv)),
    };
    let bias_at = |b: usize, h: usize, i: usize, j: usize| -> f64 {
        let Some((shape, vals)) = bias else {
            return 0.0;
        };
        let full = [b, h, i, j];
        let pad = 4 - shape.len();
        let mut idx = 0;
        for (a, &dim) in shape.iter().enumerate() {
            let x = if dim == 1 { 0 } else { full[a + pad] };
            idx = idx * dim + x;
        }
        vals[idx]
    };
    let mut out = vec![0.0; batch * seq_q * heads_q * d];
    let mut scores = vec![0.0f64; seq_kv];
    for b in 0..batch {
        for h in 0..heads_q {
            let hk = h / group;
            for i in 0..seq_q {
                let qrow = &q[((b * seq_q + i) * heads_q + h) * d..][..d];
                for (j, sc) in scores.iter_mut().enumerate() {
                    let krow = &k[((b * seq_kv + j) * heads_kv + hk) * d..][..d];
                    let dot: f64 = qrow.iter().zip(krow).map(|(x, y)| x * y).sum();
                    let visible = offset.is_none_or(|o| j <= i + o);
                    *sc = if visible {
                        dot * scale + bias_at(b, h, i, j)
                    } else {
                        f64::NEG_INFINITY
                    };
                }
                let mx = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = scores.iter().map(|s| (s - mx).exp()).collect();
                let sum: f64 = e.iter().sum();
                let o = &mut out[((b * seq_q + i) * heads_q + h) * d..][..d];
                for (j, w) in e.iter().enumerate() {
                    let vrow = &v[((b * seq_kv + j) * heads_kv + hk) * d..][..d];
                    for (x, y) in o.iter_mut().zip(vrow) {
                        *x += w / sum * y;
                    }
                }
            }
        }
    }
    out
}

#[derive(Clone, Copy, Debug)]
enum Bias {
    None,
    Full,
    HeadsKeys,
    QueryKeys,
}

struct Case {
    dtype: DType,
    dims: Dims,
    causal: Option<CausalMask>,
    bias: Bias,
    scale: Option<f64>,
    layout: Layout,
}

/// `(b, s, h, d)` values as `(b, h, s, d)`.
fn to_bhsd(x: &[f64], b: usize, s: usize, h: usize, d: usize) -> Vec<f64> {
    let mut y = vec![0.0; x.len()];
    for bi in 0..b {
        for si in 0..s {
            for hi in 0..h {
                let src = ((bi * s + si) * h + hi) * d;
                let dst = ((bi * h + hi) * s + si) * d;
                y[dst..dst + d].copy_from_slice(&x[src..src + d]);
            }
        }
    }
    y
}

/// `(b, h, s, d)` values as `(b, s, h, d)`.
fn from_bhsd(y: &[f64], b: usize, s: usize, h: usize, d: usize) -> Vec<f64> {
    let mut x = vec![0.0; y.len()];
    for bi in 0..b {
        for si in 0..s {
            for hi in 0..h {
                let dst = ((bi * s + si) * h + hi) * d;
                let src = ((bi * h + hi) * s + si) * d;
                x[dst..dst + d].copy_from_slice(&y[src..src + d]);
            }
        }
    }
    x
}

fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    let seqs = [
        (1, 1),
        (17, 17),
        (127, 127),
        (300, 300),
        (17, 300),
        (300, 17),
        (1, 127),
    ];
    let mut n = 0usize;
    for d in [64, 128] {
        for &(seq_q, seq_kv) in &seqs {
            for causal in [
                None,
                Some(CausalMask::TopLeft),
                Some(CausalMask::BottomRight),
            ] {
                let (heads_q, heads_kv) = [(4, 4), (8, 2), (4, 1)][n % 3];
                let bias = [Bias::None, Bias::Full, Bias::HeadsKeys, Bias::QueryKeys][n % 4];
                n += 1;
                v.push(Case {
                    dtype: DType::F16,
                    dims: Dims {
                        batch: 2,
                        seq_q,
                        seq_kv,
                        heads_q,
                        heads_kv,
                        d,
                    },
                    causal,
                    bias,
                    scale: None,
                    layout: Layout::Bsnh,
                });
            }
        }
    }
    use Layout::{Bhsd, Bsnh};
    #[rustfmt::skip]
    let extra = [
        (DType::BF16, 300, 300, 8, 2, 128, Some(CausalMask::BottomRight), Bias::Full, None, Bsnh),
        (DType::BF16, 127, 17, 4, 4, 64, None, Bias::HeadsKeys, Some(0.3), Bsnh),
        (DType::BF16, 17, 300, 4, 1, 64, Some(CausalMask::TopLeft), Bias::None, None, Bsnh),
        (DType::F16, 300, 127, 2, 2, 32, Some(CausalMask::TopLeft), Bias::QueryKeys, None, Bsnh),
        (DType::F16, 127, 300, 6, 3, 80, Some(CausalMask::BottomRight), Bias::Full, None, Bsnh),
        (DType::F16, 300, 300, 4, 2, 128, None, Bias::None, Some(0.05), Bsnh),
        (DType::F16, 300, 127, 8, 2, 128, Some(CausalMask::BottomRight), Bias::Full, None, Bhsd),
        (DType::BF16, 17, 17, 4, 4, 64, None, Bias::HeadsKeys, None, Bhsd),
        (DType::F16, 127, 300, 4, 1, 64, Some(CausalMask::TopLeft), Bias::QueryKeys, None, Bhsd),
        (DType::F16, 1, 300, 2, 2, 128, None, Bias::None, None, Bhsd),
    ];
    for (dtype, seq_q, seq_kv, heads_q, heads_kv, d, causal, bias, scale, layout) in extra {
        v.push(Case {
            dtype,
            dims: Dims {
                batch: 2,
                seq_q,
                seq_kv,
                heads_q,
                heads_kv,
                d,
            },
            causal,
            bias,
            scale,
            layout,
        });
    }
    v
}

#[test]
fn fused_attention_matches_the_f64_reference() {
    let Some(gpu) = common::gpu_or_skip("fused_attention_matches_the_f64_reference") else {
        return;
    };
    let fa = FlashAttention::on(gpu.clone()).unwrap();
    println!("{} (kernels for {})", gpu.describe(), fa.arch());
    let mut failures = Vec::new();
    for (ci, c) in cases().into_iter().enumerate() {
        let dm = c.dims;
        let seed = ci as u64 * 7 + 1;
        let (qt, q) = input(c.dtype, &[dm.batch, dm.seq_q, dm.heads_q, dm.d], seed, 1.0);
        let (kt, k) = input(
            c.dtype,
            &[dm.batch, dm.seq_kv, dm.heads_kv, dm.d],
            seed + 1,
            1.0,
        );
        let (vt, v) = input(
            c.dtype,
            &[dm.batch, dm.seq_kv, dm.heads_kv, dm.d],
            seed + 2,
            1.0,
        );
        let bias_shape: Option<Vec<usize>> = match c.bias {
            Bias::None => None,
            Bias::Full => Some(vec![dm.batch, dm.heads_q, dm.seq_q, dm.seq_kv]),
            Bias::HeadsKeys => Some(vec![1, dm.heads_q, 1, dm.seq_kv]),
            Bias::QueryKeys => Some(vec![dm.seq_q, dm.seq_kv]),
        };
        let bias = bias_shape
            .as_ref()
            .map(|s| input(c.dtype, s, seed + 3, 2.0));
        let opts = AttentionOptions {
            scale: c.scale,
            causal: c.causal,
            layout: c.layout,
        };
        // BHSD operands: the same (already rounded, so exactly representable) values moved.
        let lay = |t: Tensor, vals: &[f64], s: usize, h: usize| -> Tensor {
            match c.layout {
                Layout::Bsnh => t,
                Layout::Bhsd => Tensor::new(
                    vec![dm.batch, h, s, dm.d],
                    Storage::from_f64(c.dtype, to_bhsd(vals, dm.batch, s, h, dm.d)),
                )
                .unwrap(),
            }
        };
        let qt = lay(qt, &q, dm.seq_q, dm.heads_q);
        let kt = lay(kt, &k, dm.seq_kv, dm.heads_kv);
        let vt = lay(vt, &v, dm.seq_kv, dm.heads_kv);
        let up = |t: &Tensor| GpuTensor::upload(&gpu, t).unwrap();
        let (qg, kg, vg) = (up(&qt), up(&kt), up(&vt));
        let bg = bias.as_ref().map(|(t, _)| up(t));
        let out = fa.run(&qg, &kg, &vg, bg.as_ref(), &opts).unwrap();
        let got = out.download().unwrap();
        assert_eq!(got.shape(), qt.shape());
        assert_eq!(got.dtype(), c.dtype);
        let got = match c.layout {
            Layout::Bsnh => got.to_f64_vec(),
            Layout::Bhsd => from_bhsd(&got.to_f64_vec(), dm.batch, dm.seq_q, dm.heads_q, dm.d),
        };
        let scale = c.scale.unwrap_or(1.0 / (dm.d as f64).sqrt());
        let want = reference(
            dm,
            &q,
            &k,
            &v,
            bias_shape
                .as_deref()
                .zip(bias.as_ref().map(|(_, b)| b.as_slice())),
            scale,
            c.causal,
        );
        let nan = got.iter().filter(|x| !x.is_finite()).count();
        let err = got
            .iter()
            .zip(&want)
            .fold(0.0f64, |m, (a, b)| m.max((a - b).abs()));
        let range = want.iter().fold(0.0f64, |m, x| m.max(x.abs()));
        let tol = if c.dtype == DType::BF16 { 1.2e-2 } else { 2e-3 };
        let line = format!(
            "{} {:?} {dm:?} causal {:?} bias {:?} scale {scale:.4}: max err {err:.2e} (range {range:.3}, tol {tol:.1e}), {nan} non-finite",
            c.dtype, c.layout, c.causal, c.bias
        );
        println!("{line}");
        if nan > 0 || err > tol {
            failures.push(line);
        }
    }
    assert!(
        failures.is_empty(),
        "failed cases:\n{}",
        failures.join("\n")
    );
}

/// The masks really mask: with TopLeft on equal lengths, query 0 sees only key 0, so its
/// output row is V's row 0 exactly (up to the output rounding); and a key past the visible
/// range with a huge value changes nothing.
#[test]
fn causal_rows_see_only_their_keys() {
    let Some(gpu) = common::gpu_or_skip("causal_rows_see_only_their_keys") else {
        return;
    };
    let fa = FlashAttention::on(gpu.clone()).unwrap();
    let dt = DType::F16;
    let (qt, _) = input(dt, &[1, 70, 2, 64], 11, 1.0);
    let (kt, _) = input(dt, &[1, 70, 2, 64], 12, 1.0);
    let (vt, v) = input(dt, &[1, 70, 2, 64], 13, 1.0);
    let up = |t: &Tensor| GpuTensor::upload(&gpu, t).unwrap();
    let opts = AttentionOptions {
        scale: None,
        causal: Some(CausalMask::TopLeft),
        ..Default::default()
    };
    let a = fa
        .run(&up(&qt), &up(&kt), &up(&vt), None, &opts)
        .unwrap()
        .download()
        .unwrap()
        .to_f64_vec();
    // Query 0, head 0 and head 1: V[0, 0, h, :].
    for h in 0..2 {
        let got = &a[h * 64..][..64];
        let want = &v[h * 64..][..64];
        assert_eq!(got, want, "head {h}: query 0 must copy V's row 0");
    }
    // Key 69's value row set to 1000: only query 69 may change.
    let mut v2 = v.clone();
    for x in &mut v2[69 * 2 * 64..] {
        *x = 1000.0;
    }
    let vt2 = Tensor::new(vec![1, 70, 2, 64], Storage::from_f64(dt, v2)).unwrap();
    let b = fa
        .run(&up(&qt), &up(&kt), &up(&vt2), None, &opts)
        .unwrap()
        .download()
        .unwrap()
        .to_f64_vec();
    let row = 2 * 64;
    assert_eq!(a[..69 * row], b[..69 * row], "rows before 69 saw key 69");
    assert_ne!(a[69 * row..], b[69 * row..], "row 69 must see key 69");
}

/// Bad operands are typed errors before any launch.
#[test]
fn bad_operands_are_errors_not_launches() {
    let Some(gpu) = common::gpu_or_skip("bad_operands_are_errors_not_launches") else {
        return;
    };
    let fa = FlashAttention::on(gpu.clone()).unwrap();
    let z = |dt: DType, s: &[usize]| GpuTensor::zeros(&gpu, dt, s.to_vec()).unwrap();
    let q = z(DType::F16, &[1, 8, 3, 64]);
    let k = z(DType::F16, &[1, 8, 2, 64]);
    let e = fa
        .run(&q, &k, &k, None, &AttentionOptions::default())
        .unwrap_err();
    assert!(e.to_string().contains("do not divide"), "{e}");
    let k32 = z(DType::F32, &[1, 8, 3, 64]);
    let e = fa
        .run(&k32, &k32, &k32, None, &AttentionOptions::default())
        .unwrap_err();
    assert!(e.to_string().contains("float16 or bfloat16"), "{e}");
}
