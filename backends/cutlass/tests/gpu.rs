//! GPU numerics of the generated kernels against the CPU reference: every epilogue of the
//! table (bias, relu, gelu, silu, residual add / multiply, relu after the residual), every
//! dtype (float16, bfloat16 with `bf16 = true`, float32), transposed and batched GEMMs,
//! conv2d with strides, padding and dilation, and awkward shapes (M, N, K not multiples of any
//! tile; odd K and C for the 1-element alignment path). Without a device the cases are still
//! partitioned and claimed (checked) and the numerics are skipped with a printed reason;
//! `FUSEBOX_REQUIRE_GPU=1` turns the skip into a failure.
//!
//! The sm_90a wgmma + TMA path (`arch = "sm_90a"`) is checked the same way on a device of
//! compute capability 9.0 (H100 / H200): the same GEMM cases plus shapes that are multiples of
//! 8 but not of any tile (K tails, M and N edges, batched A with a shared B), every epilogue;
//! the heuristic's kernel for each case is printed and at least the qualifying cases must be
//! wgmma kernels. On another device it is skipped with the reason.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failure is a panic"
)]

use fusebox_cuda::testing as common;

use fusebox_core::backend::pipeline::{BackendPipeline, Plan};
use fusebox_core::config::Config;
use fusebox_core::ir::DType;
use fusebox_core::runtime::{Storage, Tensor, Value};

fn pipeline(options: &str) -> BackendPipeline {
    fusebox_cpu::link();
    fusebox_cutlass::link();
    let src = format!(
        "target = \"cuda\"\n[partition]\nbind_constants = false\nannotate_codegen = true\n\
         fuse_ops = false\n[[backend]]\nname = \"cutlass\"\n[backend.options]\n{options}\n\
         [[backend]]\nname = \"cpu\"\n"
    );
    BackendPipeline::new(Config::parse(&src, "gpu-test.toml").unwrap(), None).unwrap()
}

fn input(dtype: DType, shape: &[usize], seed: u64) -> Tensor {
    let n: usize = shape.iter().product();
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let v: Vec<f64> = (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 33) as f64) / ((1u64 << 31) as f64) * 2.0 - 1.0
        })
        .collect();
    Tensor::new(shape.to_vec(), Storage::from_f64(dtype, v)).unwrap()
}

fn execute(plan: &Plan, args: Vec<Value>) -> Value {
    let hook = |name: &str, vals: &[Value]| plan.call(name, vals);
    fusebox_cpu::run_with(&plan.module, "main", args, Some(&hook))
        .unwrap()
        .to_host()
        .unwrap()
}

fn tensors(v: &Value) -> Vec<Tensor> {
    match v {
        Value::Tensor(t) => vec![t.clone()],
        Value::Tuple(items) => items.iter().flat_map(tensors).collect(),
        other => panic!("unexpected output {other:?}"),
    }
}

fn assert_close(case: &str, got: &[Tensor], want: &[Tensor], rtol: f64) {
    assert_eq!(got.len(), want.len(), "{case}: output count");
    for (g, w) in got.iter().zip(want) {
        assert_eq!(g.shape(), w.shape(), "{case}: shape");
        let (gv, wv) = (g.to_f64_vec(), w.to_f64_vec());
        let range = wv.iter().fold(0.0f64, |m, x| m.max(x.abs()));
        let err = gv
            .iter()
            .zip(&wv)
            .fold(0.0f64, |m, (a, b)| m.max((a - b).abs()));
        let tol = 1e-5 + rtol * range;
        println!("{case}: max err {err:.3e}, range {range:.3e}, tol {tol:.3e}");
        assert!(err <= tol, "{case}: max err {err} > {tol} (range {range})");
    }
}

struct Case {
    name: String,
    src: String,
    inputs: Vec<(DType, Vec<usize>)>,
}

fn shape_text(s: &[usize]) -> String {
    let p: Vec<String> = s.iter().map(ToString::to_string).collect();
    if p.len() == 1 {
        format!("({},)", p[0])
    } else {
        format!("({})", p.join(", "))
    }
}

/// `main(params) { body }` with one output.
fn module(params: &[(&str, DType, Vec<usize>)], body: &[String], out: &str) -> String {
    let ps: Vec<String> = params
        .iter()
        .map(|(n, d, s)| format!("{n}: R.Tensor({}, dtype=\"{}\")", shape_text(s), d.name()))
        .collect();
    let mut src = format!(
        "@I.ir_module\nclass Module:\n    @R.function\n    def main({}):\n        with R.dataflow():\n",
        ps.join(", ")
    );
    for l in body {
        src.push_str(&format!("            {l}\n"));
    }
    src.push_str(&format!(
        "            R.output({out})\n        return {out}\n"
    ));
    src
}

/// The epilogue tails of TVM's table (after the root `lv`), with the extra params they use.
fn tails() -> Vec<(&'static str, Vec<&'static str>, Vec<&'static str>)> {
    vec![
        ("plain", vec![], vec![]),
        ("bias", vec!["y = R.add(lv, b)"], vec!["b"]),
        (
            "bias_relu",
            vec!["t = R.add(lv, b)", "y = R.nn.relu(t)"],
            vec!["b"],
        ),
        (
            "bias_gelu",
            vec!["t = R.add(lv, b)", "y = R.nn.gelu(t)"],
            vec!["b"],
        ),
        (
            "bias_silu",
            vec!["t = R.add(lv, b)", "y = R.nn.silu(t)"],
            vec!["b"],
        ),
        (
            "bias_residual_add_relu",
            vec!["t = R.add(lv, b)", "u = R.add(t, r)", "y = R.nn.relu(u)"],
            vec!["b", "r"],
        ),
        (
            "bias_relu_residual_multiply",
            vec![
                "t = R.add(lv, b)",
                "u = R.nn.relu(t)",
                "y = R.multiply(r, u)",
            ],
            vec!["b", "r"],
        ),
    ]
}

fn gemm_cases(d: DType) -> Vec<Case> {
    let mut out = Vec::new();
    // (m, n, k, transposed, batch)
    let shapes = [
        (64, 64, 64, false, 0),
        (100, 72, 40, false, 0),
        (130, 200, 77, true, 0),
        (33, 18, 9, false, 0),
        (257, 129, 136, true, 0),
        (48, 40, 24, false, 3),
    ];
    for (m, n, k, tr, batch) in shapes {
        for (tname, lines, extra) in tails() {
            let lead: Vec<usize> = if batch > 0 { vec![batch] } else { vec![] };
            let x: Vec<usize> = lead.iter().copied().chain([m, k]).collect();
            let w: Vec<usize> = if tr {
                vec![n, k]
            } else {
                lead.iter().copied().chain([k, n]).collect()
            };
            let o: Vec<usize> = lead.iter().copied().chain([m, n]).collect();
            let mut params = vec![("x", d, x), ("w", d, w)];
            let mut body = Vec::new();
            if tr {
                body.push("wt = R.permute_dims(w)".to_string());
                body.push("lv = R.matmul(x, wt)".to_string());
            } else {
                body.push("lv = R.matmul(x, w)".to_string());
            }
            for e in &extra {
                params.push(match *e {
                    "b" => ("b", d, vec![n]),
                    _ => ("r", d, o.clone()),
                });
            }
            if lines.is_empty() {
                body.push("y = R.nn.relu(lv)".to_string()); // stays in main: checks the handoff
            }
            body.extend(lines.iter().map(ToString::to_string));
            let inputs = params.iter().map(|(_, d, s)| (*d, s.clone())).collect();
            out.push(Case {
                name: format!(
                    "{} gemm {m}x{n}x{k} tr={tr} batch={batch} {tname}",
                    d.name()
                ),
                src: module(&params, &body, "y"),
                inputs,
            });
        }
    }
    out
}

/// GEMMs for the wgmma path: K (and N for a row-major rhs) multiples of 8 (16-byte TMA row
/// strides), none of M, N, K a multiple of the 128 × 128/256 × 64 tiles.
fn wgmma_gemm_cases(d: DType) -> Vec<Case> {
    let mut out = gemm_cases(d);
    // (m, n, k, transposed, batch)
    let shapes = [
        (300, 264, 200, false, 0),
        (1000, 520, 1096, true, 0),
        (136, 72, 8, false, 0),
        (200, 136, 72, true, 2),
        (129, 257, 64, false, 2),
    ];
    for (m, n, k, tr, batch) in shapes {
        for (tname, lines, extra) in tails() {
            let lead: Vec<usize> = if batch > 0 { vec![batch] } else { vec![] };
            let x: Vec<usize> = lead.iter().copied().chain([m, k]).collect();
            let w: Vec<usize> = if tr {
                vec![n, k]
            } else {
                lead.iter().copied().chain([k, n]).collect()
            };
            let o: Vec<usize> = lead.iter().copied().chain([m, n]).collect();
            let mut params = vec![("x", d, x), ("w", d, w)];
            let mut body = Vec::new();
            if tr {
                body.push("wt = R.permute_dims(w)".to_string());
                body.push("lv = R.matmul(x, wt)".to_string());
            } else {
                body.push("lv = R.matmul(x, w)".to_string());
            }
            for e in &extra {
                params.push(match *e {
                    "b" => ("b", d, vec![n]),
                    _ => ("r", d, o.clone()),
                });
            }
            if lines.is_empty() {
                body.push("y = R.nn.relu(lv)".to_string());
            }
            body.extend(lines.iter().map(ToString::to_string));
            let inputs = params.iter().map(|(_, d, s)| (*d, s.clone())).collect();
            out.push(Case {
                name: format!(
                    "{} wgmma gemm {m}x{n}x{k} tr={tr} batch={batch} {tname}",
                    d.name()
                ),
                src: module(&params, &body, "y"),
                inputs,
            });
        }
    }
    out
}

/// The kernel the heuristic picks for each case's cutlass function on sm_90a, with `sm_count`
/// SMs (what the artifact launches on a 9.0 device with `arch = "sm_90a"`).
fn sm90a_kernels(cases: &[Case], options: &str, sm_count: usize) -> Vec<String> {
    let p = pipeline(options);
    let opts = fusebox_cutlass::Options::from_table(&toml::from_str(options).unwrap()).unwrap();
    let backend = fusebox_cutlass::CutlassBackend { options: opts };
    cases
        .iter()
        .map(|c| {
            let m = fusebox_core::text::parse_module_str(&c.src).unwrap();
            let plan = p.run(&m).unwrap();
            let (name, f) = plan
                .module
                .functions
                .iter()
                .find(|(n, _)| n.ends_with("_cutlass"))
                .unwrap_or_else(|| panic!("{}: no cutlass function", c.name));
            let (spec, pl) = backend.prepare(name, f).unwrap();
            let pl = pl.unwrap_or_else(|| panic!("{}: shapes are static", c.name));
            let k = pl
                .choose(&spec, sm_count, fusebox_cuda::Arch::Sm90a)
                .unwrap()
                .kernel_name();
            println!(
                "{}: {k} ({})",
                c.name,
                pl.path(&spec, fusebox_cuda::Arch::Sm90a)
            );
            k
        })
        .collect()
}

fn run_wgmma(cases: &[Case], options: &str, rtol: f64) {
    let gpu = common::gpu_or_skip("cutlass wgmma numerics");
    let sm = gpu.as_ref().map_or(132, |g| g.sm_count() as usize);
    let kernels = sm90a_kernels(cases, options, sm);
    let wgmma = kernels.iter().filter(|k| k.contains("_wgmma_")).count();
    // The first gemm_cases shapes (64x64x64, 100x72x40, ...) and every wgmma-specific shape
    // qualify; 130x200x77 and 33x18x9 (odd K) fall back to mma.sync.
    assert!(
        wgmma * 10 >= kernels.len() * 7,
        "{wgmma} of {}",
        kernels.len()
    );
    assert!(
        kernels
            .iter()
            .any(|k| k.contains("_gemm_nn_") && k.contains("_wgmma_"))
    );
    assert!(
        kernels
            .iter()
            .any(|k| k.contains("_gemm_tn_") && k.contains("_wgmma_"))
    );
    if let Some(g) = &gpu
        && g.compute_capability() != (9, 0)
    {
        println!(
            "wgmma numerics skipped: {} has compute capability {:?}; sm_90a CUBIN runs only on 9.0",
            g.describe(),
            g.compute_capability()
        );
        return;
    }
    run(cases, options, rtol);
}

fn conv_cases(d: DType) -> Vec<Case> {
    let mut out = Vec::new();
    // (n, h, w, c, o, r, stride, pad, dilation)
    let shapes = [
        (1, 14, 14, 64, 64, 3, 1, 1, 1),
        (2, 9, 11, 3, 20, 3, 2, 1, 1),
        (1, 8, 8, 12, 36, 1, 1, 0, 1),
        (1, 13, 13, 16, 24, 3, 1, 2, 2),
    ];
    for (nb, h, w, c, o, r, st, pad, dil) in shapes {
        let eh = (r - 1) * dil + 1;
        let p = (h + 2 * pad - eh) / st + 1;
        let q = (w + 2 * pad - eh) / st + 1;
        for (tname, lines, extra) in tails() {
            let mut params = vec![("x", d, vec![nb, h, w, c]), ("w", d, vec![o, r, r, c])];
            let mut body = vec![format!(
                "lv = R.nn.conv2d(x, w, strides=[{st}, {st}], padding=[{pad}, {pad}, {pad}, {pad}], dilation=[{dil}, {dil}], data_layout=\"NHWC\", kernel_layout=\"OHWI\")"
            )];
            for e in &extra {
                params.push(match *e {
                    "b" => ("b", d, vec![1, 1, 1, o]),
                    _ => ("r", d, vec![nb, p, q, o]),
                });
            }
            if lines.is_empty() {
                body.push("y = R.nn.relu(lv)".to_string());
            }
            body.extend(lines.iter().map(ToString::to_string));
            let inputs = params.iter().map(|(_, d, s)| (*d, s.clone())).collect();
            out.push(Case {
                name: format!(
                    "{} conv2d n{nb} {h}x{w}x{c} -> {o} k{r} s{st} p{pad} d{dil} {tname}",
                    d.name()
                ),
                src: module(&params, &body, "y"),
                inputs,
            });
        }
    }
    out
}

fn run(cases: &[Case], options: &str, rtol: f64) {
    let gpu = common::gpu_or_skip("cutlass gpu numerics").is_some();
    let p = pipeline(options);
    for c in cases {
        let m = fusebox_core::text::parse_module_str(&c.src)
            .unwrap_or_else(|e| panic!("{}: {e}\n{}", c.name, c.src));
        let plan = p.run(&m).unwrap();
        let mine: Vec<_> = plan
            .claims
            .iter()
            .filter(|cl| cl.function.ends_with("_cutlass"))
            .collect();
        assert_eq!(mine.len(), 1, "{}: {:?}", c.name, plan.claims);
        assert!(
            mine[0].declines.is_empty(),
            "{}: declined {:?}",
            c.name,
            mine[0].declines
        );
        if !gpu {
            continue;
        }
        assert_eq!(
            mine[0].backend.as_deref(),
            Some("cutlass"),
            "{}: {:?}",
            c.name,
            mine[0]
        );
        let args: Vec<Value> = c
            .inputs
            .iter()
            .enumerate()
            .map(|(i, (d, s))| Value::Tensor(input(*d, s, i as u64 + 1)))
            .collect();
        let got = tensors(&execute(&plan, args.clone()));
        let want = tensors(&fusebox_cpu::run(&m, "main", args).unwrap());
        assert_close(&c.name, &got, &want, rtol);
    }
    if !gpu {
        println!(
            "numerics skipped (no device); {} case(s) partitioned and claimed",
            cases.len()
        );
    }
}

#[test]
fn float16_gemm_and_conv2d() {
    let mut cases = gemm_cases(DType::F16);
    cases.extend(conv_cases(DType::F16));
    run(&cases, "", 1e-2);
}

#[test]
fn bfloat16_gemm_and_conv2d() {
    let mut cases = gemm_cases(DType::BF16);
    cases.extend(conv_cases(DType::BF16));
    run(&cases, "bf16 = true", 3e-2);
}

#[test]
fn float32_gemm_and_conv2d() {
    let mut cases = gemm_cases(DType::F32);
    cases.extend(conv_cases(DType::F32));
    run(&cases, "", 1e-4);
}

#[test]
fn float16_wgmma_sm90a() {
    run_wgmma(&wgmma_gemm_cases(DType::F16), "arch = \"sm_90a\"", 1e-2);
}

#[test]
fn bfloat16_wgmma_sm90a() {
    run_wgmma(
        &wgmma_gemm_cases(DType::BF16),
        "bf16 = true\narch = \"sm_90a\"",
        3e-2,
    );
}

#[test]
fn profile_picks_and_caches_a_winner() {
    let Some(_gpu) = common::gpu_or_skip("profile_picks_and_caches_a_winner") else {
        return;
    };
    let cases = gemm_cases(DType::F16);
    run(&cases[..2], "profile = true", 1e-2);
    let dir = fusebox_cuda::Cache::default_dir().unwrap();
    let text = std::fs::read_to_string(dir.join("cutlass-profile.json")).unwrap();
    assert!(text.contains("cutlass_f16_gemm_nn"), "{text}");
}
