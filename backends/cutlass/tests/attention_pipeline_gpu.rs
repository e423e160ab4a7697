//! `relax.nn.attention` through fusebox's normal flow on a GPU: a module is partitioned for a
//! `target = "cuda"` config (cutlass, then cpu), the `cutlass.attention*` functions are claimed
//! and compiled by the cutlass backend (the generated fused attention kernel), the module runs
//! through the executor with the plan's artifacts (device placement, the surrounding ops on the
//! CPU), and the result is compared with the CPU backend's run of the same, unpartitioned
//! module.
//!
//! Cases: float16 (and one bfloat16), odd sequence lengths (1 to 130 rows, one or several key
//! tiles), both causal masks on both sides of `Sq = Skv` (TVM's `|Sq - Skv|` offset for
//! `BottomRight`), full and broadcast biases, grouped-query heads, head dims 32 / 64 / 128, an
//! explicit scale, a symbolic sequence length, an attention followed by other ops, and a
//! float32 attention the cutlass claim declines (it must run on the CPU and still agree).
//!
//! Tolerance: max |GPU − CPU| ≤ 3e-3 for float16 and 1.6e-2 for bfloat16 (outputs are convex
//! combinations of values in [-1, 1]; the kernel rounds P to the element type for the P·V MMA
//! and both results are rounded to it), and no NaN. Without a device the cases are still
//! partitioned and claimed (checked) and the numerics are skipped with a printed reason;
//! `FUSEBOX_REQUIRE_GPU=1` turns the skip into a failure.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failure is a panic"
)]

use fusebox_core::backend::pipeline::{BackendPipeline, Plan};
use fusebox_core::config::Config;
use fusebox_core::ir::DType;
use fusebox_core::runtime::{Storage, Tensor, Value};
use fusebox_cuda::testing as common;

fn pipeline() -> BackendPipeline {
    fusebox_cpu::link();
    fusebox_cutlass::link();
    let src = "target = \"cuda\"\n[partition]\nbind_constants = false\nannotate_codegen = true\n\
               fuse_ops = false\n[[backend]]\nname = \"cutlass\"\n[[backend]]\nname = \"cpu\"\n";
    BackendPipeline::new(Config::parse(src, "attention-gpu-test.toml").unwrap(), None).unwrap()
}

fn input(dtype: DType, shape: &[usize], seed: u64, amp: f64) -> Tensor {
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
    Tensor::new(shape.to_vec(), Storage::from_f64(dtype, v)).unwrap()
}

fn execute(plan: &Plan, args: Vec<Value>) -> Tensor {
    let hook = |name: &str, vals: &[Value]| plan.call(name, vals);
    match fusebox_cpu::run_with(&plan.module, "main", args, Some(&hook))
        .unwrap()
        .to_host()
        .unwrap()
    {
        Value::Tensor(t) => t,
        other => panic!("expected a tensor, found {}", other.kind()),
    }
}

struct Case {
    name: &'static str,
    dtype: DType,
    q: [usize; 4],
    k: [usize; 4],
    bias: Option<[usize; 4]>,
    /// `scale=…, causal_mask=…` as written in the call.
    attrs: &'static str,
    /// Whether the cutlass backend must claim it (else it must decline).
    claimed: bool,
    /// Extra ops after the attention (`y` is its result, the output is `z`).
    after: Option<&'static str>,
    /// A symbolic query length `n` (the static one is used for the inputs).
    symbolic_q: bool,
}

fn shape_text(s: &[usize]) -> String {
    let p: Vec<String> = s.iter().map(ToString::to_string).collect();
    format!("({})", p.join(", "))
}

fn src(c: &Case) -> String {
    let dt = c.dtype.name();
    let ty = |s: String| format!("R.Tensor({s}, dtype=\"{dt}\")");
    let qshape = if c.symbolic_q {
        format!("({}, n, {}, {})", c.q[0], c.q[2], c.q[3])
    } else {
        shape_text(&c.q)
    };
    let mut params = format!(
        "q: {}, k: {}, v: {}",
        ty(qshape),
        ty(shape_text(&c.k)),
        ty(shape_text(&c.k))
    );
    let call = match c.bias {
        Some(b) => {
            params.push_str(&format!(", b: {}", ty(shape_text(&b))));
            format!("R.nn.attention_bias(q, k, v, b{})", c.attrs)
        }
        None => format!("R.nn.attention(q, k, v{})", c.attrs),
    };
    let sym = if c.symbolic_q {
        "        n = T.int64()\n"
    } else {
        ""
    };
    let (tail, out) = match c.after {
        Some(t) => (format!("            {t}\n"), "z"),
        None => (String::new(), "y"),
    };
    format!(
        "@I.ir_module\nclass Module:\n    @R.function\n    def main({params}):\n{sym}        with R.dataflow():\n            y = {call}\n{tail}            R.output({out})\n        return {out}\n"
    )
}

fn cases() -> Vec<Case> {
    let c = |name, q, k, bias, attrs| Case {
        name,
        dtype: DType::F16,
        q,
        k,
        bias,
        attrs,
        claimed: true,
        after: None,
        symbolic_q: false,
    };
    let mut v = vec![
        c("plain_odd", [2, 37, 4, 64], [2, 53, 4, 64], None, ""),
        c(
            "topleft_square",
            [1, 97, 2, 64],
            [1, 97, 2, 64],
            None,
            ", causal_mask=\"TopLeft\"",
        ),
        c(
            "bottomright_short_q",
            [2, 5, 4, 128],
            [2, 131, 4, 128],
            None,
            ", causal_mask=\"BottomRight\"",
        ),
        c(
            "bottomright_long_q",
            [1, 130, 2, 64],
            [1, 7, 2, 64],
            None,
            ", causal_mask=\"BottomRight\"",
        ),
        c(
            "topleft_long_q",
            [1, 130, 2, 32],
            [1, 19, 2, 32],
            None,
            ", causal_mask=\"TopLeft\"",
        ),
        c(
            "gqa_causal",
            [2, 67, 8, 64],
            [2, 67, 2, 64],
            None,
            ", causal_mask=\"BottomRight\"",
        ),
        c(
            "single_row",
            [3, 1, 4, 64],
            [3, 200, 4, 64],
            None,
            ", scale=0.2",
        ),
        c(
            "bias_full",
            [2, 37, 4, 64],
            [2, 45, 4, 64],
            Some([2, 4, 37, 45]),
            "",
        ),
        c(
            "bias_broadcast_causal_gqa",
            [2, 37, 8, 128],
            [2, 45, 2, 128],
            Some([1, 8, 1, 45]),
            ", scale=0.1, causal_mask=\"TopLeft\"",
        ),
        c(
            "bias_batch_rows",
            [2, 29, 4, 96],
            [2, 75, 4, 96],
            Some([2, 1, 29, 75]),
            ", causal_mask=\"BottomRight\"",
        ),
    ];
    v.push(Case {
        dtype: DType::BF16,
        ..c(
            "bf16_causal_bias",
            [2, 41, 4, 64],
            [2, 41, 2, 64],
            Some([1, 4, 41, 41]),
            ", causal_mask=\"TopLeft\"",
        )
    });
    v.push(Case {
        symbolic_q: true,
        ..c(
            "symbolic_seq",
            [2, 23, 4, 64],
            [2, 23, 4, 64],
            None,
            ", causal_mask=\"BottomRight\"",
        )
    });
    v.push(Case {
        after: Some("z = R.nn.relu(R.add(y, y))"),
        ..c("then_cpu_ops", [1, 33, 4, 64], [1, 33, 4, 64], None, "")
    });
    v.push(Case {
        dtype: DType::F32,
        claimed: false,
        ..c("f32_declined", [1, 17, 2, 64], [1, 17, 2, 64], None, "")
    });
    v
}

#[test]
fn attention_runs_on_the_fused_kernel_and_matches_the_cpu_backend() {
    let gpu = common::gpu_or_skip("cutlass attention through the pipeline").is_some();
    let p = pipeline();
    for c in cases() {
        let text = src(&c);
        let m = fusebox_core::text::parse_module_str(&text)
            .unwrap_or_else(|e| panic!("{}: {e}\n{text}", c.name));
        let plan = p.run(&m).unwrap();
        let mine: Vec<_> = plan
            .claims
            .iter()
            .filter(|cl| cl.function.ends_with("_cutlass"))
            .collect();
        assert_eq!(mine.len(), 1, "{}: {:?}", c.name, plan.claims);
        assert!(
            mine[0].function.contains("attention"),
            "{}: {:?}",
            c.name,
            mine[0]
        );
        let declined = mine[0].declines.iter().any(|(b, _)| b == "cutlass");
        assert_eq!(
            declined, !c.claimed,
            "{}: declines {:?}",
            c.name, mine[0].declines
        );
        if !gpu {
            // Claimed functions reach compile, which needs the device.
            if c.claimed {
                assert!(
                    mine[0]
                        .compile_failures
                        .iter()
                        .any(|(b, e)| b == "cutlass" && e.contains("no CUDA device")),
                    "{}: {:?}",
                    c.name,
                    mine[0]
                );
            }
            continue;
        }
        assert!(
            mine[0].compile_failures.is_empty(),
            "{}: {:?}",
            c.name,
            mine[0].compile_failures
        );
        let want_backend = if c.claimed { "cutlass" } else { "cpu" };
        assert_eq!(
            mine[0].backend.as_deref(),
            Some(want_backend),
            "{}: {:?}",
            c.name,
            mine[0]
        );
        let kv = c.k;
        let mut args = vec![
            Value::Tensor(input(c.dtype, &c.q, 1, 1.0)),
            Value::Tensor(input(c.dtype, &kv, 2, 1.0)),
            Value::Tensor(input(c.dtype, &kv, 3, 1.0)),
        ];
        if let Some(b) = c.bias {
            args.push(Value::Tensor(input(c.dtype, &b, 4, 2.0)));
        }
        let got = execute(&plan, args.clone());
        let want = match fusebox_cpu::run(&m, "main", args).unwrap() {
            Value::Tensor(t) => t,
            other => panic!("expected a tensor, found {}", other.kind()),
        };
        assert_eq!(got.shape(), want.shape(), "{}", c.name);
        assert_eq!(got.dtype(), c.dtype, "{}", c.name);
        let (gv, wv) = (got.to_f64_vec(), want.to_f64_vec());
        let nan = gv.iter().filter(|x| !x.is_finite()).count();
        let err = gv
            .iter()
            .zip(&wv)
            .fold(0.0f64, |m, (a, b)| m.max((a - b).abs()));
        let tol = match c.dtype {
            DType::BF16 => 1.6e-2,
            DType::F16 => 3e-3,
            _ => 1e-6,
        };
        println!(
            "{}: {} on {want_backend}, max |gpu - cpu| {err:.2e} (tol {tol:.1e}), {nan} non-finite",
            c.name, mine[0].function
        );
        assert!(
            nan == 0 && err <= tol,
            "{}: max err {err}, {nan} non-finite",
            c.name
        );
    }
    if !gpu {
        println!("numerics skipped (no device); the cases were partitioned and claimed");
    }
}
