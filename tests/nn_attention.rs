//! `relax.nn.attention` / `relax.nn.attention_bias` end to end on the CPU: type inference and
//! its errors, the text format as TVM 0.27 prints it, and the CPU kernel against
//!
//! - a naive reference written here (the softmax materialised in f64, TVM's legalization read
//!   as a definition: scores · scale + bias, the causal mask `j <= i + offset`, grouped-query
//!   heads), over odd sequence lengths, both causal kinds on both sides of `Sq = Skv`, full and
//!   broadcast biases, GQA, float32 / float16 / bfloat16 / float64;
//! - TVM itself: `tests/tvm/attention/tvm_attention.json` holds TVM 0.27's `mod.script()` of
//!   seven modules and the outputs of `relax.build` (LegalizeOps, llvm) on seeded inputs
//!   (`tests/tvm/attention/generate.py` regenerates it). fusebox parses TVM's text and runs it.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    missing_docs,
    reason = "test code: a failure is a panic"
)]

mod common;

use common::fixture_tensor;
use fusebox_core::ir::DType;
use fusebox_core::text::{self, ConstTable};
use fusebox_cpu::{Storage, Tensor, Value, run};

fn parse(src: &str) -> Result<fusebox_core::ir::Module, String> {
    text::parse_module(src, "<input>", &ConstTable::new()).map_err(|e| e.to_string())
}

/// A deterministic pseudo-random stream (SplitMix64) in [-1, 1).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 52) as f64 - 1.0
    }

    /// A tensor of `dtype`, and its values as the tensor holds them (rounded to the dtype).
    fn tensor(&mut self, shape: &[usize], dtype: DType, amp: f64) -> (Tensor, Vec<f64>) {
        let n: usize = shape.iter().product();
        let v: Vec<f64> = (0..n).map(|_| self.next() * amp).collect();
        let t = Tensor::new(shape.to_vec(), Storage::from_f64(dtype, v)).unwrap();
        let held = t.to_f64_vec();
        (t, held)
    }
}

#[derive(Clone, Debug)]
struct Case {
    b: usize,
    sq: usize,
    skv: usize,
    n: usize,
    nk: usize,
    h: usize,
    hv: usize,
    bias: Option<[usize; 4]>,
    scale: Option<f64>,
    causal: Option<&'static str>,
}

/// The definition, in f64: per (batch, query head, query row) the softmax of the visible
/// scores, materialised.
fn reference(c: &Case, q: &[f64], k: &[f64], v: &[f64], bias: Option<&[f64]>) -> Vec<f64> {
    let scale = c.scale.unwrap_or(1.0 / (c.h as f64).sqrt());
    let offset = match c.causal {
        None => None,
        Some("TopLeft") => Some(0),
        Some(_) => Some(c.sq.abs_diff(c.skv)),
    };
    let group = c.n / c.nk;
    let mut out = vec![0.0; c.b * c.sq * c.n * c.hv];
    for b in 0..c.b {
        for hq in 0..c.n {
            let hk = hq / group;
            for i in 0..c.sq {
                let mut s = vec![f64::NEG_INFINITY; c.skv];
                for (j, sj) in s.iter_mut().enumerate() {
                    if offset.is_some_and(|o| j > i + o) {
                        continue;
                    }
                    let mut dot = 0.0;
                    for d in 0..c.h {
                        dot += q[((b * c.sq + i) * c.n + hq) * c.h + d]
                            * k[((b * c.skv + j) * c.nk + hk) * c.h + d];
                    }
                    let mut x = dot * scale;
                    if let (Some(bs), Some(bd)) = (c.bias, bias) {
                        let at = |dim: usize, idx: usize| if bs[dim] == 1 { 0 } else { idx };
                        x += bd[((at(0, b) * bs[1] + at(1, hq)) * bs[2] + at(2, i)) * bs[3] + j];
                    }
                    *sj = x;
                }
                let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = s.iter().map(|&x| (x - m).exp()).collect();
                let z: f64 = e.iter().sum();
                for dv in 0..c.hv {
                    let mut acc = 0.0;
                    for (j, ej) in e.iter().enumerate() {
                        acc += ej / z * v[((b * c.skv + j) * c.nk + hk) * c.hv + dv];
                    }
                    out[((b * c.sq + i) * c.n + hq) * c.hv + dv] = acc;
                }
            }
        }
    }
    out
}

fn shape_text(s: &[usize]) -> String {
    let p: Vec<String> = s.iter().map(ToString::to_string).collect();
    format!("({})", p.join(", "))
}

fn module_text(c: &Case, dtype: DType) -> String {
    let dt = dtype.name();
    let ty = |s: &[usize]| format!("R.Tensor({}, dtype=\"{dt}\")", shape_text(s));
    let mut params = format!(
        "q: {}, k: {}, v: {}",
        ty(&[c.b, c.sq, c.n, c.h]),
        ty(&[c.b, c.skv, c.nk, c.h]),
        ty(&[c.b, c.skv, c.nk, c.hv])
    );
    let (op, bias_arg) = match c.bias {
        Some(bs) => {
            params.push_str(&format!(", bias: {}", ty(&bs)));
            ("attention_bias", ", bias")
        }
        None => ("attention", ""),
    };
    let scale = c
        .scale
        .map_or("None".to_string(), |s| format!("T.float32({s})"));
    let causal = c.causal.map_or("None".to_string(), |m| format!("\"{m}\""));
    format!(
        "@I.ir_module\nclass Module:\n    @R.function\n    def main({params}):\n        with R.dataflow():\n            y = R.nn.{op}(q, k, v{bias_arg}, scale={scale}, causal_mask={causal}, window_size=None)\n            R.output(y)\n        return y\n"
    )
}

fn check(c: &Case, dtype: DType, seed: u64) {
    let mut r = Rng(seed);
    let (q, qv) = r.tensor(&[c.b, c.sq, c.n, c.h], dtype, 1.0);
    let (k, kv) = r.tensor(&[c.b, c.skv, c.nk, c.h], dtype, 1.0);
    let (v, vv) = r.tensor(&[c.b, c.skv, c.nk, c.hv], dtype, 1.0);
    let bias = c.bias.map(|bs| r.tensor(&bs, dtype, 2.0));
    let m = parse(&module_text(c, dtype)).unwrap_or_else(|e| panic!("{c:?}: {e}"));
    let mut args = vec![Value::Tensor(q), Value::Tensor(k), Value::Tensor(v)];
    if let Some((bt, _)) = &bias {
        args.push(Value::Tensor(bt.clone()));
    }
    let out = match run(&m, "main", args).unwrap_or_else(|e| panic!("{c:?}: {e}")) {
        Value::Tensor(t) => t,
        other => panic!("expected a tensor, found {}", other.kind()),
    };
    assert_eq!(out.dtype(), dtype, "{c:?}");
    assert_eq!(out.shape(), &[c.b, c.sq, c.n, c.hv], "{c:?}");
    let want = reference(c, &qv, &kv, &vv, bias.as_ref().map(|(_, d)| d.as_slice()));
    // f32 accumulation; the output rounded to the dtype (outputs are within [-1, 1]).
    let tol = match dtype {
        DType::F16 => 2e-3,
        DType::BF16 => 1.6e-2,
        _ => 2e-5,
    };
    for (i, (g, w)) in out.to_f64_vec().iter().zip(&want).enumerate() {
        assert!(
            (g - w).abs() <= tol,
            "{c:?} {dtype}: element {i}: got {g}, want {w} (tolerance {tol})"
        );
    }
}

fn cases() -> Vec<Case> {
    let base = Case {
        b: 2,
        sq: 37,
        skv: 37,
        n: 4,
        nk: 4,
        h: 16,
        hv: 16,
        bias: None,
        scale: None,
        causal: None,
    };
    let mut v = Vec::new();
    // Odd lengths on both sides of Sq = Skv, more than one key block (64) on one side.
    for (sq, skv) in [(37, 37), (5, 83), (83, 5), (1, 130), (65, 64)] {
        for causal in [None, Some("TopLeft"), Some("BottomRight")] {
            v.push(Case {
                sq,
                skv,
                causal,
                ..base.clone()
            });
        }
    }
    // Grouped-query heads (4 query heads per key/value head), head_dim_v != head_dim.
    v.push(Case {
        n: 8,
        nk: 2,
        hv: 24,
        sq: 19,
        skv: 71,
        causal: Some("BottomRight"),
        ..base.clone()
    });
    // Biases: full, broadcast over batch/heads/rows, with a scale and a causal mask.
    for bias in [[2, 4, 37, 45], [1, 4, 1, 45], [2, 1, 37, 45], [1, 1, 1, 45]] {
        v.push(Case {
            skv: 45,
            bias: Some(bias),
            scale: Some(0.3),
            causal: Some("TopLeft"),
            ..base.clone()
        });
    }
    v.push(Case {
        n: 6,
        nk: 3,
        skv: 29,
        bias: Some([1, 6, 37, 29]),
        ..base.clone()
    });
    v
}

#[test]
fn cpu_kernel_matches_the_materialised_f64_definition_f32() {
    for (i, c) in cases().iter().enumerate() {
        check(c, DType::F32, 100 + i as u64);
    }
}

#[test]
fn cpu_kernel_matches_the_materialised_f64_definition_f16_bf16_f64() {
    for (i, c) in cases().iter().enumerate() {
        for dtype in [DType::F16, DType::BF16, DType::F64] {
            check(c, dtype, 500 + i as u64);
        }
    }
}

/// The causal masks as TVM's documentation draws them (`relax.op.nn.attention`'s docstring):
/// with equal scores and values = key index, each output is the mean of the visible keys.
#[test]
fn causal_masks_are_tvms_documented_matrices() {
    // (sq, skv, kind, visible keys per row) from the docstring.
    let docs: [(usize, usize, &str, &[usize]); 4] = [
        (4, 2, "TopLeft", &[1, 2, 2, 2]),
        (4, 2, "BottomRight", &[2, 2, 2, 2]),
        (2, 4, "TopLeft", &[1, 2]),
        (2, 4, "BottomRight", &[3, 4]),
    ];
    for (sq, skv, kind, visible) in docs {
        let c = Case {
            b: 1,
            sq,
            skv,
            n: 1,
            nk: 1,
            h: 1,
            hv: 1,
            bias: None,
            scale: None,
            causal: Some(kind),
        };
        let m = parse(&module_text(&c, DType::F32)).unwrap();
        let q = Tensor::from_f32(vec![1, sq, 1, 1], vec![0.0; sq]).unwrap();
        let k = Tensor::from_f32(vec![1, skv, 1, 1], vec![0.0; skv]).unwrap();
        let v = Tensor::from_f32(vec![1, skv, 1, 1], (0..skv).map(|j| j as f32).collect()).unwrap();
        let out = run(
            &m,
            "main",
            vec![Value::Tensor(q), Value::Tensor(k), Value::Tensor(v)],
        )
        .unwrap();
        let Value::Tensor(out) = out else {
            panic!("not a tensor")
        };
        let got = out.to_f64_vec();
        for (i, &n) in visible.iter().enumerate() {
            let mean = (0..n).map(|j| j as f64).sum::<f64>() / n as f64;
            assert!(
                (got[i] - mean).abs() < 1e-6,
                "{kind} sq={sq} skv={skv} row {i}: {} keys visible means {mean}, got {}",
                n,
                got[i]
            );
        }
    }
}

fn infer_error(params: &str, call: &str) -> String {
    let src = format!(
        "@I.ir_module\nclass Module:\n    @R.function\n    def main({params}):\n        with R.dataflow():\n            att = {call}\n            R.output(att)\n        return att\n"
    );
    match parse(&src) {
        Ok(_) => panic!("`{call}` should not type-check"),
        Err(e) => e,
    }
}

#[test]
fn type_inference_follows_tvm_and_names_the_binding() {
    let t = |s: &str| format!("R.Tensor({s}, dtype=\"float16\")");
    // The output: (B, Sq, N, Hv), with symbolic dims flowing through.
    let src = format!(
        "@I.ir_module\nclass Module:\n    @R.function\n    def main(q: {}, k: {}, v: {}, b: {}):\n        n = T.int64()\n        with R.dataflow():\n            att = R.nn.attention_bias(q, k, v, b)\n            R.output(att)\n        return att\n",
        t("(2, n, 8, 64)"),
        t("(2, 7, 2, 64)"),
        t("(2, 7, 2, 32)"),
        t("(1, 8, 1, 7)")
    );
    let m = parse(&src).unwrap();
    let printed = text::print_module(&m).text;
    assert!(
        printed.contains("att: R.Tensor((2, n, 8, 32), dtype=\"float16\") = R.nn.attention_bias(q, k, v, b, scale=None, causal_mask=None, window_size=None)"),
        "{printed}"
    );
    let qkv = format!(
        "q: {}, k: {}, v: {}",
        t("(2, 5, 8, 64)"),
        t("(2, 7, 2, 64)"),
        t("(2, 7, 2, 64)")
    );
    let cases: Vec<(String, String, &str)> = vec![
        (
            format!(
                "q: {}, k: {}, v: {}",
                t("(2, 5, 8, 64)"),
                t("(2, 7, 3, 64)"),
                t("(2, 7, 3, 64)")
            ),
            "R.nn.attention(q, k, v)".into(),
            "number of heads (8) to be a multiple of the key's (3)",
        ),
        (
            format!(
                "q: {}, k: {}, v: {}",
                t("(2, 5, 8, 64)"),
                t("(2, 7, 2, 32)"),
                t("(2, 7, 2, 64)")
            ),
            "R.nn.attention(q, k, v)".into(),
            "the query and key head dims to be the same, found 64 and 32",
        ),
        (
            format!(
                "q: {}, k: {}, v: {}",
                t("(3, 5, 8, 64)"),
                t("(2, 7, 2, 64)"),
                t("(2, 7, 2, 64)")
            ),
            "R.nn.attention(q, k, v)".into(),
            "batch sizes to be the same, found 3 and 2",
        ),
        (
            format!(
                "q: {}, k: {}, v: {}",
                t("(2, 5, 8, 64)"),
                t("(2, 7, 2, 64)"),
                t("(2, 6, 2, 64)")
            ),
            "R.nn.attention(q, k, v)".into(),
            "the key and value sequence lengths to be the same, found 7 and 6",
        ),
        (
            format!(
                "q: {}, k: {}, v: {}",
                t("(2, 5, 64)"),
                t("(2, 7, 2, 64)"),
                t("(2, 7, 2, 64)")
            ),
            "R.nn.attention(q, k, v)".into(),
            "found the query with 3 dimensions",
        ),
        (
            format!("{qkv}, b: {}", t("(2, 8, 5, 6)")),
            "R.nn.attention_bias(q, k, v, b)".into(),
            "the bias's last dim to be the key sequence length (7), found 6",
        ),
        (
            format!("{qkv}, b: {}", t("(2, 4, 5, 7)")),
            "R.nn.attention_bias(q, k, v, b)".into(),
            "the bias's dim 1 to be the number of heads (8) or 1, found 4",
        ),
        (
            format!("{qkv}, b: {}", t("(8, 5, 7)")),
            "R.nn.attention_bias(q, k, v, b)".into(),
            "found the bias with 3 dimensions",
        ),
        (
            format!(
                "q: {}, k: {}, v: {}",
                t("(2, 5, 8, 64)"),
                "R.Tensor((2, 7, 2, 64), dtype=\"float32\")",
                t("(2, 7, 2, 64)")
            ),
            "R.nn.attention(q, k, v)".into(),
            "same dtype, found float16 and float32",
        ),
        (
            qkv.clone(),
            "R.nn.attention(q, k, v, causal_mask=\"Diagonal\")".into(),
            "expected \"TopLeft\", \"BottomRight\" or None",
        ),
        (
            qkv.clone(),
            "R.nn.attention(q, k, v, window_size=0)".into(),
            "at least 1 key, found 0",
        ),
        (
            qkv.clone(),
            "R.nn.attention(q, k, v, q)".into(),
            "expected a literal attribute value",
        ),
    ];
    for (params, call, want) in cases {
        let e = infer_error(&params, &call);
        assert!(e.contains(want), "`{call}`: {e}");
        // Positioned on the binding's line.
        assert!(e.contains(":6:"), "`{call}`: {e}");
    }
}

#[test]
fn window_size_is_a_run_time_error_not_a_panic() {
    let c = Case {
        b: 1,
        sq: 3,
        skv: 3,
        n: 1,
        nk: 1,
        h: 4,
        hv: 4,
        bias: None,
        scale: None,
        causal: Some("BottomRight"),
    };
    let src = module_text(&c, DType::F32).replace("window_size=None", "window_size=2");
    let m = parse(&src).unwrap();
    let z = || Value::Tensor(Tensor::from_f32(vec![1, 3, 1, 4], vec![0.5; 12]).unwrap());
    let e = run(&m, "main", vec![z(), z(), z()]).expect_err("no kernel for a sliding window");
    assert!(e.to_string().contains("window_size=2"), "{e}");
}

// ----- TVM's own outputs -----

#[test]
fn cpu_kernel_matches_tvm_relax_build() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/tvm/attention/tvm_attention.json"
    );
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let fx: serde_json::Value = serde_json::from_str(&text).unwrap();
    let cases = fx["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 7);
    for c in cases {
        let name = c["name"].as_str().unwrap();
        let script = c["script"].as_str().unwrap();
        // TVM's text, as `mod.script()` printed it, parses; printing gives back its op line.
        let m = parse(script).unwrap_or_else(|e| panic!("{name}: {e}"));
        let tvm_line = script
            .lines()
            .find(|l| l.contains("R.nn.attention"))
            .unwrap()
            .trim()
            .to_string();
        let ours = text::print_module(&m).text;
        assert!(ours.contains(&tvm_line), "{name}: {tvm_line}\n{ours}");
        let args = c["inputs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| {
                let (shape, data) = fixture_tensor(t);
                Value::Tensor(Tensor::from_f32(shape, data).unwrap())
            })
            .collect();
        let Value::Tensor(out) = run(&m, "main", args).unwrap_or_else(|e| panic!("{name}: {e}"))
        else {
            panic!("{name}: not a tensor")
        };
        let (shape, want) = fixture_tensor(&c["output"]);
        assert_eq!(out.shape(), shape.as_slice(), "{name}");
        assert_eq!(out.numel(), want.len(), "{name}");
        for (i, (g, w)) in out.to_f32_vec().iter().zip(&want).enumerate() {
            assert!(
                (g - w).abs() <= 2e-5 * (1.0 + w.abs()),
                "{name}: element {i}: fusebox {g}, TVM {w}"
            );
        }
    }
}
