#!/usr/bin/env bash
# Issue 19's speed table: fusebox against onnxruntime's CPU provider, same run, 2 threads each.
#
# For each model directory (made by bench/export_models.py; the light ResNet-50 by
# tests/ort/resnet50_random.py, made here), ROUNDS rounds alternate onnxruntime and fusebox; each
# runs once to warm up, then REPEAT timed runs, and reports the median. Prints each round's
# times and ratio, then per model the median of the per-round ratios, and checks fusebox's
# outputs against onnxruntime's (tests/ort/compare.py: max abs error within 1e-3 of the range).
#
# Usage: bench/models.sh MODELS_DIR [ROUNDS (default 5)] [REPEAT (default 5)] [MODEL ...]
#   MODELS_DIR holds bert-base/, gpt2/, mobilenet-v2/ from
#   `.venv-export/bin/python bench/export_models.py MODELS_DIR`; resnet50/ is made here.
#   FUSEBOX_BENCH_PROFILE=1 adds fusebox's `--profile` lines of the last round.
#   Before each model and after the last, bench/vcpu_probe.py (3 rounds) prints whether the VM's
#   two CPUs are independent right now (median ratio near 1.0) or share cores (up to 2.0): a
#   two-thread round in a shared stretch measures the host as much as the code.
#   FUSEBOX_BENCH_PROBE=0 leaves it out.
# A benchmark, not a test: it asserts nothing about the time; a numerics mismatch exits 1.
set -euo pipefail
cd "$(dirname "$0")/.."
models_dir="${1:?usage: bench/models.sh MODELS_DIR [ROUNDS] [REPEAT] [MODEL ...]}"
rounds="${2:-5}"
repeat="${3:-5}"
shift $(( $# < 3 ? $# : 3 ))
models=("$@")
[ ${#models[@]} -gt 0 ] || models=(bert-base gpt2 resnet50 mobilenet-v2)
threads=2

if ! .venv/bin/python -c "import onnx, onnxruntime" 2>/dev/null; then
  python3 -m venv .venv
  .venv/bin/pip install --quiet "onnx==1.*" numpy "onnxruntime==1.*"
fi
cargo build --quiet --release --locked

# The light ResNet-50 in the same layout as the exported models.
if [[ " ${models[*]} " == *" resnet50 "* ]] && [ ! -f "$models_dir/resnet50/model/model.onnx" ]; then
  tmp="$(mktemp -d)"
  .venv/bin/python tests/ort/resnet50_random.py --out "$tmp" >/dev/null 2>&1
  mkdir -p "$models_dir/resnet50/model" "$models_dir/resnet50/inputs" "$models_dir/resnet50/outputs"
  mv "$tmp/resnet50_random.onnx" "$models_dir/resnet50/model/model.onnx"
  mv "$tmp/input.npy" "$models_dir/resnet50/inputs/gpu_0_data_0.npy"
  mv "$tmp/expected.npy" "$models_dir/resnet50/outputs/gpu_0_softmax_1.npy"
  mv "$tmp/expected_logits.npy" "$models_dir/resnet50/outputs/$(cat "$tmp/logits_name").npy"
  rm -rf "$tmp"
fi

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); $(date -u +%F); commit $(git rev-parse --short HEAD)"
summary=()
status=0
probe() {
  if [ "${FUSEBOX_BENCH_PROBE:-1}" = 1 ] && [ "$(nproc)" -ge 2 ]; then
    echo "vcpu probe $1: $(.venv/bin/python bench/vcpu_probe.py --rounds 3 | tail -n 1)"
  fi
}
for m in "${models[@]}"; do
  dir="$models_dir/$m"
  model="$dir/model/model.onnx"
  [ -f "$model" ] || { echo "$m: $model is missing (run bench/export_models.py)" >&2; exit 1; }
  ins=()
  while IFS= read -r pair; do
    ins+=(--input "$pair")
  done < <(.venv/bin/python bench/ort_time.py "$model" "$dir/inputs" --list-inputs)
  out="$(mktemp -d)"
  probe "before $m"
  ratios=()
  for r in $(seq 1 "$rounds"); do
    ort="$(.venv/bin/python bench/ort_time.py "$model" "$dir/inputs" --threads "$threads" \
      --repeat "$repeat" | awk '/^time ort_run/ {print $3}')"
    prof=()
    if [ "${FUSEBOX_BENCH_PROFILE:-0}" = 1 ] && [ "$r" = "$rounds" ]; then prof=(--profile); fi
    log="$(FUSEBOX_THREADS=$threads ./target/release/fusebox run "$model" "${ins[@]}" \
      --output-dir "$out/run$r" --timings --repeat "$repeat" "${prof[@]}" 2>&1 >/dev/null)"
    fb="$(awk '/^time run/ {print $3}' <<<"$log")"
    ratio="$(awk -v f="$fb" -v o="$ort" 'BEGIN {printf "%.3f", f / o}')"
    ratios+=("$ratio")
    echo "$m round $r: onnxruntime $ort ms, fusebox $fb ms, ratio $ratio"
    if [ ${#prof[@]} -gt 0 ]; then grep '^profile' <<<"$log" | head -30; fi
  done
  med="$(printf '%s\n' "${ratios[@]}" | sort -n | awk '{a[NR] = $1} END {
    m = (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2
    printf "median %.3f over %d rounds (min %.3f, max %.3f)", m, NR, a[1], a[NR]}')"
  summary+=("$m: fusebox / onnxruntime $med")
  pairs=()
  for f in "$dir"/outputs/*.npy; do
    pairs+=("$f" "$out/run$rounds/$(basename "$f")")
  done
  .venv/bin/python tests/ort/compare.py "${pairs[@]}" || status=1
  rm -rf "$out"
done
probe "after the last model"
printf '%s\n' "${summary[@]}"
exit "$status"
