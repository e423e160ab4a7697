#!/usr/bin/env bash
# ResNet-50 on the CPU: fusebox against onnxruntime's CPU provider, measured in the same run.
#
# The light ResNet-50 of the `onnx` package with seeded random weights (tests/ort/resnet50_random.py),
# batch 1, 2 threads each (onnxruntime: intra_op_num_threads = 2; fusebox: FUSEBOX_THREADS=2).
# The two alternate for ROUNDS rounds; each round runs onnxruntime and then fusebox `--repeat
# REPEAT` times after a warm-up and takes the median. Prints each round's times and ratio, then
# the median of the per-round ratios, and checks fusebox's outputs against onnxruntime's.
#
# Usage: bench/resnet50_ort.sh [ROUNDS (default 5)] [REPEAT (default 15)]
# Needs the `.venv` that scripts/test.sh makes (onnx, onnxruntime, numpy from PyPI); makes it
# the same way when it is missing. A benchmark, not a test: it asserts nothing about the time.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-5}"
repeat="${2:-15}"

if ! .venv/bin/python -c "import onnx, onnxruntime" 2>/dev/null; then
  python3 -m venv .venv
  .venv/bin/pip install --quiet "onnx==1.*" numpy "onnxruntime==1.*"
fi
cargo build --quiet --release --locked
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT

.venv/bin/python tests/ort/resnet50_random.py --out "$dir/model" >/dev/null
ratios=()
for r in $(seq 1 "$rounds"); do
  ort="$(.venv/bin/python tests/ort/resnet50_random.py --out "$dir/ort" --bench "$repeat" \
    | awk '/^time ort_run/ {print $3}')"
  fb="$(FUSEBOX_THREADS=2 ./target/release/fusebox run "$dir/model/resnet50_random.onnx" \
    --input gpu_0/data_0="$dir/model/input.npy" --output-dir "$dir/out" \
    --timings --repeat "$repeat" 2>&1 >/dev/null | awk '/^time run/ {print $3}')"
  ratio="$(awk -v f="$fb" -v o="$ort" 'BEGIN {printf "%.3f", f / o}')"
  ratios+=("$ratio")
  echo "round $r: onnxruntime $ort ms, fusebox $fb ms, ratio $ratio"
done
printf '%s\n' "${ratios[@]}" | sort -n | awk '{a[NR] = $1} END {
  m = (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2
  printf "fusebox / onnxruntime: median %.3f over %d rounds (min %.3f, max %.3f)\n", m, NR, a[1], a[NR]
}'
.venv/bin/python tests/ort/compare.py \
  "$dir/model/expected.npy" "$dir/out/gpu_0_softmax_1.npy" \
  "$dir/model/expected_logits.npy" "$dir/out/$(cat "$dir/model/logits_name").npy"
