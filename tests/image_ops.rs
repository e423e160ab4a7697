//! `relax.image.grid_sample`, `relax.image.affine_grid` and `relax.reverse_sequence` against
//! TVM itself: `tests/tvm/image/tvm_image.json` holds TVM 0.27's `mod.script()` of 22 modules
//! (every method × padding mode × `align_corners` of `grid_sample` on a channel-first grid
//! whose coordinates reach past [-1, 1], `affine_grid` both ways, `reverse_sequence`
//! time-major and batch-major) and the outputs of
//! `relax.build` (LegalizeOps, llvm) on seeded inputs (`tests/tvm/image/generate.py`
//! regenerates it). fusebox parses TVM's text, prints its op line back, runs it on the CPU and
//! compares. The ONNX node conformance cases (`tests/onnx_node.rs`) check the same kernels
//! against ONNX's reference through the `GridSample`, `AffineGrid` and `ReverseSequence`
//! importers.
//!
//! One known difference: with `bicubic` and `border`, a coordinate outside the borders is
//! clamped to the edge pixel first in ONNX (its reference and onnxruntime), which fusebox
//! follows, while TVM (as PyTorch) leaves the coordinate and clamps only the taps. The two
//! agree wherever the coordinates lie within the borders; the test checks exactly that.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    missing_docs,
    reason = "test code: a failure is a panic"
)]

mod common;

use common::fixture_tensor;
use fusebox_core::text::{self, ConstTable};
use fusebox_cpu::{Storage, Tensor, Value, run};

/// An input tensor of the fixture, of its dtype (float32 or int64).
fn input(v: &serde_json::Value) -> Value {
    let (shape, data) = fixture_tensor(v);
    match v["dtype"].as_str().unwrap() {
        "int64" => Value::Tensor(
            Tensor::new(
                shape,
                Storage::I64(data.iter().map(|&x| x as i64).collect()),
            )
            .unwrap(),
        ),
        "float32" => Value::Tensor(Tensor::from_f32(shape, data).unwrap()),
        d => panic!("unexpected fixture dtype {d}"),
    }
}

#[test]
fn sampling_ops_and_reverse_sequence_match_tvm_relax_build() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/tvm/image/tvm_image.json"
    );
    let src = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let fx: serde_json::Value = serde_json::from_str(&src).unwrap();
    let cases = fx["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 22);
    let mut report = Vec::new();
    for c in cases {
        let name = c["name"].as_str().unwrap();
        let script = c["script"].as_str().unwrap();
        let m = text::parse_module(script, "<tvm>", &ConstTable::new())
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let tvm_line = script
            .lines()
            .find(|l| l.contains("R.image.") || l.contains("R.reverse_sequence"))
            .unwrap()
            .trim()
            .to_string();
        let ours = text::print_module(&m).text;
        assert!(ours.contains(&tvm_line), "{name}: {tvm_line}\n{ours}");
        let args = c["inputs"].as_array().unwrap().iter().map(input).collect();
        let Value::Tensor(out) = run(&m, "main", args).unwrap_or_else(|e| panic!("{name}: {e}"))
        else {
            panic!("{name}: not a tensor")
        };
        let (shape, want) = fixture_tensor(&c["output"]);
        assert_eq!(out.shape(), shape.as_slice(), "{name}");
        let got = out.to_f32_vec();
        // Which output points TVM's bicubic-border rule may differ at (see the module doc).
        let outside = if name.starts_with("grid_sample_bicubic_border") {
            let (xs, _) = fixture_tensor(&c["inputs"][0]);
            let (gs, g) = fixture_tensor(&c["inputs"][1]);
            let align = name.ends_with("_1");
            let unnorm = |v: f32, n: usize| {
                let n = n as f32;
                if align {
                    (v + 1.0) / 2.0 * (n - 1.0)
                } else {
                    ((v + 1.0) * n - 1.0) / 2.0
                }
            };
            let lo_hi = |n: usize| {
                if align {
                    (0.0, n as f32 - 1.0)
                } else {
                    (-0.5, n as f32 - 0.5)
                }
            };
            let points = gs[2] * gs[3];
            let out_of = |b: usize, p: usize| {
                let x = unnorm(g[(b * 2) * points + p], xs[3]);
                let y = unnorm(g[(b * 2 + 1) * points + p], xs[2]);
                let ((x0, x1), (y0, y1)) = (lo_hi(xs[3]), lo_hi(xs[2]));
                x < x0 || x > x1 || y < y0 || y > y1
            };
            Some(
                (0..got.len())
                    .map(|i| out_of(i / (xs[1] * points), i % points))
                    .collect::<Vec<_>>(),
            )
        } else {
            None
        };
        let differs = |i: usize| (got[i] - want[i]).abs() > 1e-5 * (1.0 + want[i].abs());
        if let Some(outside) = &outside {
            let inside_bad = (0..got.len())
                .filter(|&i| !outside[i] && differs(i))
                .count();
            let n_out = outside.iter().filter(|&&o| o).count();
            assert_eq!(
                inside_bad, 0,
                "{name}: points with coordinates inside the borders differ"
            );
            assert!(
                n_out > 0 && (0..got.len()).any(|i| outside[i] && differs(i)),
                "{name}"
            );
            report.push(format!(
                "{name}: 0 of {} differ inside the borders ({n_out} points outside, ONNX's rule)",
                want.len()
            ));
            continue;
        }
        let bad = (0..got.len()).filter(|&i| differs(i)).count();
        let worst = got
            .iter()
            .zip(&want)
            .map(|(g, w)| (g - w).abs())
            .fold(0.0f32, f32::max);
        report.push(format!(
            "{name}: {bad} of {} differ, worst {worst:e}",
            want.len()
        ));
    }
    println!("{}", report.join("\n"));
    assert!(
        report.iter().all(|r| r.contains(": 0 of")),
        "{}",
        report.join("\n")
    );
}
