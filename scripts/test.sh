#!/usr/bin/env bash
# The one command that runs every check: formatting, lints, and all tests of the workspace.
# It installs what it needs itself: crates (fetched by cargo), and a local, git-ignored Python
# venv `.venv` with the `onnx` package, whose backend test data the ONNX conformance test reads.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== ONNX test data (.venv with onnx from PyPI)"
if ! .venv/bin/python -c "import onnx, onnxruntime" 2>/dev/null; then
  python3 -m venv .venv
  .venv/bin/pip install --quiet "onnx==1.*" numpy "onnxruntime==1.*"
fi
ONNX_DATA_DIR="$(.venv/bin/python -c 'import os, onnx; print(os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data"))')"
export ONNX_DATA_DIR
echo "ONNX_DATA_DIR=$ONNX_DATA_DIR"

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== cargo clippy (deny warnings)"
cargo clippy --workspace --all-targets --locked -- -D warnings

echo "== build the plugin cdylibs the integration tests load"
cargo build --locked -p fusebox-plugin-conv2d -p fusebox-plugin-test-bad-abi -p fusebox-plugin-test-misbehave

echo "== cargo test"
cargo test --workspace --locked

echo "== ONNX conformance counts (the same test as above, its report shown)"
cargo test --locked --test onnx_conformance -- --nocapture 2>/dev/null \
  | grep -E '^(onnx conformance|light |FAIL )' || true

echo "== ResNet-50 with seeded random weights: fusebox (release) against onnxruntime"
ort_dir="$(mktemp -d)"
.venv/bin/python tests/ort/resnet50_random.py --out "$ort_dir" --bench 5
cargo run --quiet --release --locked -- run "$ort_dir/resnet50_random.onnx" \
  --input gpu_0/data_0="$ort_dir/input.npy" --output-dir "$ort_dir/out" --timings --repeat 5
.venv/bin/python tests/ort/compare.py \
  "$ort_dir/expected.npy" "$ort_dir/out/gpu_0_softmax_1.npy" \
  "$ort_dir/expected_logits.npy" "$ort_dir/out/$(cat "$ort_dir/logits_name").npy"
rm -rf "$ort_dir"

echo "== main job smoke test: fusebox show / check on the bundled example"
cargo run --quiet --locked -- check examples/conv2d_relu.relax
cargo run --quiet --locked -- partition examples/conv2d_relu_x2.relax --patterns examples/dnnl_patterns.toml --annotate-codegen true --emit json > /dev/null
cargo run --quiet --locked -- show examples/conv2d_relu.relax > /dev/null
cargo run --quiet --locked -- partition examples/conv2d_relu_x2.relax --patterns examples/dnnl_patterns.toml --fuse-ops --emit json > /dev/null
cargo run --quiet --locked -- partition examples/conv2d_relu.relax --fuse-ops --fuse-opt-level 1 --max-depth 8 > /dev/null
smoke_out="$(mktemp -d)"
# The README's main-job command (the bundled small CNN, default config, partition report, check).
cargo run --quiet --release --locked -- run examples/small_cnn.relax --config configs/cpu.toml --check --output-dir "$smoke_out"
cargo run --quiet --locked -- run examples/conv2d_bias_relu_x2.relax --config configs/plugin-example.toml --check --output-dir "$smoke_out" > /dev/null
cargo run --quiet --locked -- run "$ONNX_DATA_DIR/light/light_squeezenet.onnx" --check --timings --output-dir "$smoke_out" > /dev/null
cargo run --quiet --locked -- run examples/conv2d_relu_x2.relax --patterns examples/dnnl_patterns.toml --check --profile --output-dir "$smoke_out" > /dev/null
rm -rf "$smoke_out"
cargo run --quiet --locked -- backends
cargo run --quiet --locked -- backends --config configs/plugin-example.toml > /dev/null
cargo run --quiet --locked -- partition examples/conv2d_relu_x2.relax --config configs/plugin-example.toml --emit json > /dev/null
cargo run --quiet --locked -- explain examples/conv2d_relu_x2.relax --config configs/plugin-example.toml --binding conv1 > /dev/null
