//! The `cpu` backend's transformer patterns on the exported models of `tests/models` (issue 19):
//! partitioned as `configs/cpu.toml` does, BERT gets one attention composite per layer, every
//! LayerNorm fused with its residual add and every dense layer with its bias (and GELU); every `cpu.*` composite of every fixture family
//! is run by a fused kernel (its body has the form the kernel expects, no silent fallback);
//! and the fused run gives the same bits for 1, 2 and 3 kernel threads.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code panics on failure"
)]

use fusebox_core::frontend::onnx::import_onnx_file;
use fusebox_core::ir::{Callee, ExprKind, Function, Module};
use fusebox_cpu::{Tensor, Value};
use std::collections::BTreeMap;
use std::path::PathBuf;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn partition(fixture: &str) -> (Module, fusebox_core::backend::pipeline::Plan) {
    let path = root().join("tests/models").join(fixture).join("model.onnx");
    assert!(path.exists(), "{}: missing fixture", path.display());
    let module = import_onnx_file(&path).unwrap_or_else(|e| panic!("{fixture}: {e}"));
    let config = fusebox_core::config::Config::load(&root().join("configs/cpu.toml")).unwrap();
    let pipeline = fusebox::pipeline(config).unwrap();
    let plan = pipeline.run(&module).unwrap();
    (module, plan)
}

/// The composites a function is or holds (a `Codegen` wrapper binds its composite locally).
fn composites(f: &Function) -> Vec<(&str, &Function)> {
    let mut out = Vec::new();
    if let Some(c) = &f.attrs.composite {
        out.push((c.as_str(), f));
    }
    for b in f.bindings() {
        if let ExprKind::Function(inner) = &f.expr(b.value).kind
            && let Some(c) = &inner.attrs.composite
        {
            out.push((c.as_str(), &**inner));
        }
    }
    out
}

/// Per composite name: how many times main calls it, and the fused kernel of each body.
fn census(m: &Module) -> BTreeMap<String, (usize, Vec<Option<&'static str>>)> {
    let main = m.get("main").unwrap();
    let mut out: BTreeMap<String, (usize, Vec<Option<&'static str>>)> = BTreeMap::new();
    for b in main.bindings() {
        if let ExprKind::Call {
            callee: Callee::Global(g),
            ..
        } = &main.expr(b.value).kind
        {
            let f = m.get(g).unwrap();
            for (name, body) in composites(f) {
                let e = out.entry(name.to_string()).or_default();
                e.0 += 1;
                e.1.push(fusebox_cpu::fused_kernel(body));
            }
        }
    }
    out
}

/// The ops main still calls itself, and those inside FuseOps groups (not composites).
fn loose_layer_norms(m: &Module) -> usize {
    m.functions
        .values()
        .filter(|f| composites(f).is_empty())
        .flat_map(|f| f.bindings().map(move |b| f.expr(b.value)))
        .filter(|e| {
            matches!(&e.kind, ExprKind::Call { callee: Callee::Op(op), .. } if op.name() == "relax.nn.layer_norm")
        })
        .count()
}

#[test]
fn bert_gets_one_attention_per_layer_and_residual_layer_norms() {
    for fixture in ["bert-ts", "bert-dynamo"] {
        let (_, plan) = partition(fixture);
        let c = census(&plan.module);
        let layers = 2; // tests/models/README.md: 2 layers
        let calls = |name: &str| c.get(name).map_or(0, |e| e.0);
        let attn = calls("cpu.attention") + calls("cpu.attention_heads");
        let rln = calls("cpu.residual_layer_norm");
        assert_eq!(attn, layers, "{fixture}: attention composites {c:?}");
        // The heads' transposes are inside the attention composite (the dynamo export's keys
        // once ComposePermutes has made their four steps one transpose).
        assert_eq!(calls("cpu.attention_heads"), layers, "{fixture}: {c:?}");
        // Two per layer, and the embeddings' (word + position embeddings, then LayerNorm).
        assert_eq!(rln, 2 * layers + 1, "{fixture}: residual LayerNorms {c:?}");
        assert_eq!(
            loose_layer_norms(&plan.module),
            0,
            "{fixture}: a LayerNorm is not fused with its residual add"
        );
        // Each layer's FFN up-projection is one dense layer with its GELU; Q, K, V, the
        // attention output and the FFN down-projection are dense layers with their bias.
        assert_eq!(
            c.get("cpu.dense_gelu").map_or(0, |e| e.0),
            layers,
            "{fixture}: {c:?}"
        );
        assert_eq!(
            c.get("cpu.dense_bias").map_or(0, |e| e.0),
            5 * layers,
            "{fixture}: {c:?}"
        );
        assert!(
            !c.contains_key("cpu.gelu"),
            "{fixture}: a GELU outside its dense layer: {c:?}"
        );
    }
}

#[test]
fn every_transformer_composite_runs_a_fused_kernel() {
    // (fixture, composite, calls in main)
    // Every composite main calls, per fixture (whisper's two GELUs after its convolutions
    // are not dense layers).
    let want: &[(&str, &[(&str, usize)])] = &[
        (
            "gpt2-ts",
            &[
                ("cpu.attention_heads", 2),
                ("cpu.dense_bias", 6),
                ("cpu.dense_gelu_tanh", 2),
                ("cpu.residual_layer_norm", 5),
            ],
        ),
        (
            "gpt2-dynamo",
            &[
                ("cpu.attention_heads", 2),
                ("cpu.dense_gelu_tanh", 2),
                ("cpu.residual_layer_norm", 5),
            ],
        ),
        (
            "qwen2-ts",
            &[
                ("cpu.attention_grouped", 2),
                ("cpu.dense_bias", 6),
                ("cpu.rms_norm", 5),
                ("cpu.rope", 4),
                ("cpu.silu_gated", 2),
            ],
        ),
        (
            "t5-encoder-ts",
            &[
                ("cpu.attention_heads", 2),
                ("cpu.dense_relu", 2),
                ("cpu.rms_norm", 5),
            ],
        ),
        (
            "t5-encoder-dynamo",
            &[
                ("cpu.attention_heads", 2),
                ("cpu.dense_relu", 2),
                ("cpu.rms_norm", 5),
            ],
        ),
        (
            "vit-dynamo",
            &[
                ("cpu.attention_heads", 2),
                ("cpu.dense_bias", 10),
                ("cpu.dense_gelu", 2),
                ("cpu.residual_layer_norm", 5),
            ],
        ),
        (
            "videomae-ts",
            &[
                ("cpu.attention_heads", 2),
                // q, v, output and fc2 per layer, and the classifier: VideoMAE's key
                // projection has no bias (its q/v biases are concatenated with zeros).
                ("cpu.dense_bias", 9),
                ("cpu.dense_gelu", 2),
                // Two per layer; the last residual add goes into the mean pooling
                // instead, and fc_norm normalises the pooled vector alone.
                ("cpu.residual_layer_norm", 4),
            ],
        ),
        (
            "videomae-dynamo",
            &[
                ("cpu.attention_heads", 2),
                // As videomae-ts but the classifier: its bias is zero (transformers'
                // initialisation) and the dynamo exporter drops it, so it is a plain matmul.
                ("cpu.dense_bias", 8),
                ("cpu.dense_gelu", 2),
                // Two per layer; the last residual add goes into the mean pooling
                // instead, and fc_norm normalises the pooled vector alone.
                ("cpu.residual_layer_norm", 4),
            ],
        ),
        (
            // Eager attention: the scale divides the product (`matmul(q, kᵀ) / √d`).
            "mobilevit-ts",
            &[
                ("cpu.attention_heads", 9),
                ("cpu.dense_bias", 55),
                ("cpu.residual_layer_norm", 18),
            ],
        ),
        (
            "whisper-encoder-ts",
            &[
                ("cpu.attention_heads", 2),
                ("cpu.dense_bias", 8),
                ("cpu.dense_gelu", 2),
                ("cpu.gelu", 2),
                ("cpu.residual_layer_norm", 5),
            ],
        ),
        (
            "bert-ts",
            &[
                ("cpu.attention_heads", 2),
                ("cpu.dense_bias", 10),
                ("cpu.dense_gelu", 2),
                ("cpu.residual_layer_norm", 5),
            ],
        ),
        (
            "bert-ts16",
            &[
                ("cpu.attention_heads", 2),
                ("cpu.dense_bias", 10),
                ("cpu.dense_gelu", 2),
                ("cpu.layer_norm_decomposed", 5),
            ],
        ),
        (
            "bert-dynamo",
            &[
                ("cpu.attention_heads", 2),
                ("cpu.dense_bias", 10),
                ("cpu.dense_gelu", 2),
                ("cpu.residual_layer_norm", 5),
            ],
        ),
        (
            "llama-ts",
            &[
                ("cpu.attention_grouped", 2),
                ("cpu.rms_norm", 5),
                ("cpu.rope", 4),
                ("cpu.silu_gated", 2),
            ],
        ),
        (
            "llama-dynamo",
            &[
                ("cpu.attention_grouped", 2),
                ("cpu.rms_norm", 5),
                ("cpu.rope", 4),
                ("cpu.silu_gated", 2),
            ],
        ),
        (
            "mistral-dynamo",
            &[
                ("cpu.attention_grouped", 2),
                ("cpu.rms_norm", 5),
                ("cpu.rope", 4),
                ("cpu.silu_gated", 2),
            ],
        ),
        (
            // ALiBi: the bias slice added, then masked_fill before the softmax.
            "mpt-dynamo",
            &[
                ("cpu.attention_heads", 2),
                ("cpu.dense_gelu", 2),
                ("cpu.residual_layer_norm", 4),
            ],
        ),
        (
            "mpt-ts",
            &[
                ("cpu.attention_heads", 2),
                ("cpu.dense_gelu", 2),
                ("cpu.residual_layer_norm", 4),
            ],
        ),
        (
            // Disentangled attention: the scores viewed as [B, H, S, T] around the padding
            // mask's select and the softmax (a reshape before and after).
            "deberta-v2-ts",
            &[
                ("cpu.attention_reshaped", 2),
                ("cpu.dense_bias", 10),
                ("cpu.dense_gelu", 2),
                ("cpu.residual_layer_norm", 5),
            ],
        ),
        (
            "deberta-v2-dynamo",
            &[
                ("cpu.attention_reshaped", 2),
                ("cpu.dense_bias", 10),
                ("cpu.dense_gelu", 2),
                ("cpu.residual_layer_norm", 5),
            ],
        ),
        (
            // Mixture of experts: the router's softmax and top-k stay outside; each layer's
            // experts (weights gathered per row by `take`) are one composite.
            "mixtral-ts",
            &[
                ("cpu.attention_grouped", 2),
                ("cpu.moe_silu_gated", 2),
                ("cpu.rms_norm", 5),
                ("cpu.rope", 4),
            ],
        ),
        (
            // The same with `gather_nd` and a split.
            "mixtral-dynamo",
            &[
                ("cpu.attention_grouped", 2),
                ("cpu.moe_silu_gated", 2),
                ("cpu.rms_norm", 5),
                ("cpu.rope", 4),
            ],
        ),
        (
            // Local attention by blocks, written with einsums (the decoder's self-attention
            // and the cross-attention are ordinary).
            "longt5-ts",
            &[
                ("cpu.attention_einsum", 2),
                ("cpu.attention_heads", 4),
                ("cpu.dense_relu", 4),
                ("cpu.rms_norm", 11),
            ],
        ),
        (
            "longt5-dynamo",
            &[
                ("cpu.attention_einsum", 2),
                ("cpu.attention_heads", 4),
                ("cpu.dense_relu", 4),
                ("cpu.rms_norm", 11),
            ],
        ),
        (
            "gpt-neox-ts",
            &[
                ("cpu.attention", 2),
                ("cpu.dense_bias", 6),
                ("cpu.dense_gelu", 2),
                ("cpu.residual_layer_norm", 2),
                ("cpu.rope", 4),
            ],
        ),
    ];
    for (fixture, comps) in want {
        let (_, plan) = partition(fixture);
        let c = census(&plan.module);
        let names: Vec<&str> = c.keys().map(String::as_str).collect();
        let wanted: Vec<&str> = comps.iter().map(|(n, _)| *n).collect();
        assert_eq!(names, wanted, "{fixture}: the composites main calls");
        for (name, calls) in *comps {
            let (n, kernels) = c
                .get(*name)
                .unwrap_or_else(|| panic!("{fixture}: no `{name}` composite in {c:?}"));
            assert_eq!(n, calls, "{fixture}: calls of `{name}`");
            assert!(
                kernels.iter().all(Option::is_some),
                "{fixture}: a `{name}` body is not in the form its kernel runs"
            );
        }
    }
}

fn read_npy(path: &std::path::Path) -> Tensor {
    fusebox::read_npy(path).unwrap()
}

#[test]
fn fused_models_give_the_same_bits_for_every_thread_count() {
    for fixture in [
        "bert-ts",
        "gpt2-dynamo",
        "llama-ts",
        "deberta-v2-ts",
        "mixtral-dynamo",
        "longt5-ts",
    ] {
        let (module, plan) = partition(fixture);
        let set = root()
            .join("tests/models")
            .join(fixture)
            .join("seq64/inputs");
        let main = module.get("main").unwrap();
        let args: Vec<Value> = main
            .params
            .iter()
            .map(|&p| Value::Tensor(read_npy(&set.join(format!("{}.npy", main.var(p).name)))))
            .collect();
        let run = || {
            let v = fusebox::execute(&plan, "main", args.clone()).unwrap();
            let Value::Tensor(t) = v.to_host().unwrap() else {
                panic!("{fixture}: not a tensor")
            };
            t.to_f32_vec()
                .iter()
                .map(|x| x.to_bits())
                .collect::<Vec<u32>>()
        };
        let one = fusebox_cpu::par::with_threads(1, run);
        for n in [2, 3] {
            assert!(
                fusebox_cpu::par::with_threads(n, run) == one,
                "{fixture}: {n} threads differ from 1"
            );
        }
    }
}

#[test]
fn the_table_parses_lints_clean_and_stays_off_gpu_configs() {
    let names: Vec<String> = fusebox_cpu::backend::transformer_patterns()
        .iter()
        .map(|p| p.name.clone())
        .collect();
    assert_eq!(
        names,
        [
            "cpu.attention_grouped",
            "cpu.attention",
            "cpu.attention_heads",
            "cpu.attention_reshaped",
            "cpu.attention_einsum",
            "cpu.dense_gelu",
            "cpu.dense_gelu_tanh",
            "cpu.dense_relu",
            "cpu.dense_bias",
            "cpu.residual_layer_norm",
            "cpu.rms_norm",
            "cpu.gelu",
            "cpu.gelu_tanh",
            "cpu.silu_gated",
            "cpu.moe_silu_gated",
            "cpu.rope",
            "cpu.layer_norm_decomposed"
        ]
    );
    for (config, cpu_entries) in [("configs/cpu.toml", 17), ("configs/cuda.toml", 0)] {
        let c = fusebox_core::config::Config::load(&root().join(config)).unwrap();
        let pipeline = fusebox::pipeline(c).unwrap();
        let table = pipeline.patterns();
        let n = table.iter().filter(|p| p.name.starts_with("cpu.")).count();
        assert_eq!(n, cpu_entries, "{config}: cpu.* entries in the table");
        assert_eq!(
            fusebox_core::pattern_table::lint(&table),
            [],
            "{config}: lint findings"
        );
    }
    // The cuda config's table with the cpu patterns added (as a user copying them would):
    // still no findings.
    let c = fusebox_core::config::Config::load(&root().join("configs/cuda.toml")).unwrap();
    let mut table = fusebox::pipeline(c).unwrap().patterns();
    table.extend(fusebox_cpu::backend::transformer_patterns().iter().cloned());
    assert_eq!(fusebox_core::pattern_table::lint(&table), []);
}
