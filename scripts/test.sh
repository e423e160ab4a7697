#!/usr/bin/env bash
# The one command that runs every check: formatting, lints, and all tests of the workspace.
# It installs what it needs itself: crates (fetched by cargo), and a local, git-ignored Python
# venv `.venv` with the `onnx` package, whose backend test data the ONNX conformance test reads,
# and NVIDIA's NVRTC + CUDA runtime wheels (libnvrtc.so.13 and the CUDA headers), so every
# generated CUDA kernel is compiled to CUBIN even on a machine without a GPU.
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

echo "== ONNX node conformance cases (written by the onnx wheel's generators, with onnxruntime's verdicts)"
rm -rf target/onnx-node
.venv/bin/python tests/onnx/gen_node_cases.py --out target/onnx-node --ort
export ONNX_NODE_DIR="$PWD/target/onnx-node"

echo "== NVRTC and the CUDA headers (.venv with nvidia-cuda-nvrtc, nvidia-cuda-runtime 13.0 from PyPI)"
site_packages="$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
# CUDA 13 wheels install into site-packages/nvidia/cu13/{lib,include} (CUDA 12's used
# nvidia/<component>/); checked below after installing.
cu13="$site_packages/nvidia/cu13"
if [ ! -f "$cu13/lib/libnvrtc.so.13" ] || [ ! -f "$cu13/include/cuda_fp16.h" ]; then
  .venv/bin/pip install --quiet "nvidia-cuda-nvrtc==13.0.*" "nvidia-cuda-runtime==13.0.*"
fi
for f in lib/libnvrtc.so.13 lib/libnvrtc-builtins.so.13.0 include/cuda_fp16.h include/cuda_bf16.h; do
  if [ ! -f "$cu13/$f" ]; then
    echo "the NVRTC/CUDA runtime wheels did not install $cu13/$f; found:" >&2
    find "$site_packages/nvidia" -maxdepth 3 >&2 || true
    exit 1
  fi
done
export FUSEBOX_NVRTC_LIB="$cu13/lib/libnvrtc.so.13"
export FUSEBOX_CUDA_INCLUDE="$cu13/include"
# Tests that compile kernels fail (instead of skipping) when NVRTC cannot be loaded.
export FUSEBOX_REQUIRE_NVRTC=1
# Tests that read ONNX_DATA_DIR / ONNX_NODE_DIR fail (instead of skipping) when it is not set.
export FUSEBOX_REQUIRE_ONNX_DATA=1
# The compile cache of this checkout (content-addressed, so it never goes stale).
export FUSEBOX_CACHE_DIR="$PWD/target/fusebox-cuda-cache"
echo "FUSEBOX_NVRTC_LIB=$FUSEBOX_NVRTC_LIB"
echo "FUSEBOX_CUDA_INCLUDE=$FUSEBOX_CUDA_INCLUDE"

echo "== headless Chromium for the HTML report test (Debian's chromium package)"
# tests/html_report.rs opens `fusebox partition --emit html` pages in it; installed here when
# missing (CI runs as root on Debian), and the test fails instead of skipping without it.
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi
export FUSEBOX_REQUIRE_CHROMIUM=1

# A clean clone gains nothing from incremental compilation; its caches took ~3 GB of disk.
export CARGO_INCREMENTAL=0

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== cargo clippy (deny warnings)"
cargo clippy --workspace --all-targets --locked -- -D warnings

echo "== cargo doc (deny warnings: broken and private intra-doc links)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked

echo "== build the plugin cdylibs the integration tests load"
cargo build --locked -p fusebox-plugin-conv2d -p fusebox-plugin-test-bad-abi -p fusebox-plugin-test-misbehave

echo "== cargo test"
cargo test --workspace --locked

echo "== ONNX conformance counts (the same test as above, its report shown)"
# `--workspace`, as above: the same features, so the binaries `cargo test` just built run again
# (without it the root package's own feature set rebuilt three crates, about 3.5 minutes).
cargo test --workspace --locked --test onnx_conformance -- --nocapture 2>/dev/null \
  | grep -E '^(onnx conformance|light |FAIL )' || true
cargo test --workspace --locked --test onnx_node -- --nocapture 2>/dev/null \
  | grep -E '^(node conformance|FAIL |  )' || true
# The debug CLI that `cargo test --workspace` built (for the integration tests); the Python tests
# and the smoke tests below run it as is (`cargo run` would rebuild it with the root package's
# own feature set first, about 2 minutes).
fusebox_debug="$PWD/target/debug/fusebox"
test -x "$fusebox_debug"

# ---- The Python package (python/): build the wheel, install it into .venv, run its pytest suite.
echo "== Python package: maturin wheel into .venv, pytest python/tests"
py_start=$SECONDS
if ! .venv/bin/python -c "import maturin, pytest" 2>/dev/null; then
  .venv/bin/pip install --quiet "maturin>=1.9.4,<2" "pytest>=8,<10"
fi
rm -rf target/python-wheel
.venv/bin/maturin build --quiet --release --locked -m python/Cargo.toml -i .venv/bin/python --out target/python-wheel
.venv/bin/pip install --quiet --force-reinstall --no-deps target/python-wheel/fusebox-*.whl
# The tests compare with the CLI that `cargo test` built, and load the plugins built above.
FUSEBOX_CLI="$fusebox_debug" .venv/bin/python -m pytest python/tests -q -p no:cacheprovider
echo "python package: $((SECONDS - py_start)) s (wheel build + install + pytest)"
# ---- end of the Python package section

# The release CLI for the sections below, built with the wheel's feature set: selecting the
# Python package too resolves every shared crate's features as the wheel's build just did, so
# only the `fusebox` binary is compiled (about 10 s). `cargo run --release` would resolve them
# for the root package alone (`numpy` adds `default` to `num-traits`, `ndarray` and others)
# and rebuild the whole release graph, about 4.5 minutes.
echo "== the release CLI (the wheel's build, plus the fusebox binary)"
cargo build --quiet --release --locked -p fusebox -p fusebox-python --bin fusebox
fusebox_release="$PWD/target/release/fusebox"
test -x "$fusebox_release"

echo "== ResNet-50 with seeded random weights: fusebox (release) against onnxruntime"
ort_dir="$(mktemp -d)"
.venv/bin/python tests/ort/resnet50_random.py --out "$ort_dir" --bench 5
"$fusebox_release" run "$ort_dir/resnet50_random.onnx" \
  --input gpu_0/data_0="$ort_dir/input.npy" --output-dir "$ort_dir/out" --timings --repeat 5
.venv/bin/python tests/ort/compare.py \
  "$ort_dir/expected.npy" "$ort_dir/out/gpu_0_softmax_1.npy" \
  "$ort_dir/expected_logits.npy" "$ort_dir/out/$(cat "$ort_dir/logits_name").npy"
rm -rf "$ort_dir"

echo "== the nine light ONNX models: import, partition with configs/cpu.toml, run, --check (release)"
light_out="$(mktemp -d)"
for model in "$ONNX_DATA_DIR"/light/light_*.onnx; do
  printf '%s: ' "$(basename "$model")"
  "$fusebox_release" run "$model" --config configs/cpu.toml --check \
    --output-dir "$light_out" | grep -E '^check: '
done
test "$(ls "$ONNX_DATA_DIR"/light/light_*.onnx | wc -l)" -eq 9
rm -rf "$light_out"

echo "== ONNX external data: squeezenet re-saved by the onnx package with its weights in a side file, run from its folder"
ext_dir="$(mktemp -d)"
.venv/bin/python tests/onnx/to_external_data.py "$ONNX_DATA_DIR/light/light_squeezenet.onnx" "$ext_dir/model"
"$fusebox_release" run "$ONNX_DATA_DIR/light/light_squeezenet.onnx" --output-dir "$ext_dir/inline" > /dev/null
"$fusebox_release" run "$ext_dir/model" --check --output-dir "$ext_dir/external" | grep -E '^check: '
for f in "$ext_dir"/inline/*.npy; do cmp "$f" "$ext_dir/external/$(basename "$f")"; done
rm -rf "$ext_dir"

echo "== main job smoke test: fusebox show / check on the bundled example"
"$fusebox_debug" check examples/conv2d_relu.relax
"$fusebox_debug" partition examples/conv2d_relu_x2.relax --patterns examples/dnnl_patterns.toml --annotate-codegen true --emit json > /dev/null
"$fusebox_debug" show examples/conv2d_relu.relax > /dev/null
"$fusebox_debug" partition examples/conv2d_relu_x2.relax --patterns examples/dnnl_patterns.toml --fuse-ops --emit json > /dev/null
"$fusebox_debug" partition examples/conv2d_relu.relax --fuse-ops --fuse-opt-level 1 --max-depth 8 > /dev/null
smoke_out="$(mktemp -d)"
# The README's main-job command (the bundled small CNN, default config, partition report,
# check), on the release binary `cargo run --release` builds from the same sources.
"$fusebox_release" run examples/small_cnn.relax --config configs/cpu.toml --check --output-dir "$smoke_out"
"$fusebox_debug" run examples/conv2d_bias_relu_x2.relax --config configs/plugin-example.toml --check --output-dir "$smoke_out" > /dev/null
"$fusebox_debug" run "$ONNX_DATA_DIR/light/light_squeezenet.onnx" --check --timings --output-dir "$smoke_out" > /dev/null
"$fusebox_debug" run examples/conv2d_relu_x2.relax --patterns examples/dnnl_patterns.toml --check --profile --output-dir "$smoke_out" > /dev/null
rm -rf "$smoke_out"
"$fusebox_debug" backends
"$fusebox_debug" backends --config configs/plugin-example.toml > /dev/null
"$fusebox_debug" partition examples/conv2d_relu_x2.relax --config configs/plugin-example.toml --emit json > /dev/null
"$fusebox_debug" explain examples/conv2d_relu_x2.relax --config configs/plugin-example.toml --binding conv1 > /dev/null
compile_out="$(mktemp -d)"
"$fusebox_debug" compile examples/conv2d_relu_x2.relax --config configs/cpu.toml --out-dir "$compile_out" > /dev/null
test -f "$compile_out/manifest.json"
rm -rf "$compile_out"
# The cuBLAS backend: partition with TVM's cuBLAS table, explain a rejection, run (on a machine
# without a GPU the cublas compile fails with "no CUDA device" and cpu runs each function), and
# build (the plan of each claimed function, no device needed).
"$fusebox_debug" backends --config configs/examples/cublas.toml > /dev/null
"$fusebox_debug" partition tests/golden/cublas/matmul_bias_relu_gelu.relax --config configs/examples/cublas.toml --emit json > /dev/null
"$fusebox_debug" explain tests/golden/cublas/bias_2d_rejected.relax --config configs/examples/cublas.toml --binding y > /dev/null
cublas_out="$(mktemp -d)"
"$fusebox_debug" run tests/golden/cublas/matmul_bias_relu_gelu.relax --config configs/examples/cublas.toml --check --output-dir "$cublas_out" > /dev/null
"$fusebox_debug" compile tests/golden/cublas/transposed.relax --config configs/examples/cublas.toml --out-dir "$cublas_out/build" > /dev/null
test -f "$cublas_out/build/manifest.json"
rm -rf "$cublas_out"
