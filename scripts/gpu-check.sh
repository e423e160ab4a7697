#!/usr/bin/env bash
# Every GPU test (with FUSEBOX_REQUIRE_GPU=1, so a missing device fails instead of skipping) and
# every GPU benchmark, with the figures appended to bench/RESULTS.md (device, driver, date,
# commit). Where there is no GPU it says so and exits 1.
#
#   scripts/gpu-check.sh                  build with cargo and run (a GPU machine with Rust)
#   scripts/gpu-check.sh --pack [DIR]     here, without a GPU: build the test and benchmark
#                                         binaries (release), and pack NVRTC and the CUDA headers
#                                         from .venv, into DIR (default target/gpu-carry, about
#                                         40 MB compressed) for a GPU machine that has no Rust
#                                         toolchain or network
#   scripts/gpu-check.sh --prebuilt [DIR] on the GPU machine: run what --pack put in DIR
#
# With the `device` tool: `scripts/gpu-check.sh --pack` here, then
#   run(command="scripts/gpu-check.sh --prebuilt && cp bench/RESULTS.md target/gpu-check.log $OUT/",
#       carry=["target/gpu-carry"])
# and copy the appended section of RESULTS.md back into the repository.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"

# package:test-target and package:example pairs that need a GPU.
tests=(fusebox-cuda:gpu fusebox-cuda:gpu_kernels fusebox-cublas:gpu fusebox-cutlass:gpu fusebox-cutlass:attention_gpu fusebox-cutlass:attention_pipeline_gpu fusebox:cuda_target)
benches=(fusebox-cuda:bench_kernels fusebox-cublas:bench_epilogue fusebox-cutlass:bench_cutlass fusebox-cutlass:bench_attention)

mode="cargo"
dir="target/gpu-carry"
case "${1:-}" in
  --pack) mode="pack"; dir="${2:-$dir}" ;;
  --prebuilt) mode="prebuilt"; dir="${2:-$dir}" ;;
  "") ;;
  *) echo "usage: $0 [--pack [DIR] | --prebuilt [DIR]]" >&2; exit 2 ;;
esac

# The path of the executable cargo built for one test target (from its JSON messages).
test_exe() {
  local pkg="$1" target="$2"
  cargo test --release --locked -p "$pkg" --test "$target" --no-run --message-format=json 2>/dev/null |
    python3 -c '
import json, sys
want = sys.argv[1]
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == want:
        print(m["executable"])
' "$target" | tail -1
}

if [ "$mode" = "pack" ]; then
  rm -rf "$dir"
  mkdir -p "$dir/bin"
  for t in "${tests[@]}"; do
    pkg="${t%%:*}" name="${t#*:}"
    exe="$(test_exe "$pkg" "$name")"
    if [ -z "$exe" ]; then echo "gpu-check: cargo built no test \`$name\` of $pkg" >&2; exit 1; fi
    cp "$exe" "$dir/bin/$pkg--$name"
  done
  for b in "${benches[@]}"; do
    pkg="${b%%:*}" name="${b#*:}"
    cargo build --release --locked -p "$pkg" --example "$name"
    cp "target/release/examples/$name" "$dir/bin/$pkg--$name"
  done
  cargo build --release --locked
  cp target/release/fusebox "$dir/bin/fusebox"
  strip "$dir"/bin/* 2>/dev/null || true
  # Compressed: the device tool carries at most 64 MiB with the working tree.
  tar -C "$dir" -cf - bin | xz -6 -T0 > "$dir/bin.tar.xz"
  rm -rf "$dir/bin"
  site="$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  cu13="$site/nvidia/cu13"
  if [ ! -f "$cu13/lib/libnvrtc.so.13" ]; then
    echo "gpu-check: no NVRTC in .venv ($cu13); run scripts/test.sh once first" >&2
    exit 1
  fi
  tar -C "$cu13" -cf - lib/libnvrtc.so.13 lib/libnvrtc-builtins.so.13.0 include | xz -6 -T0 > "$dir/nvrtc-cu13.tar.xz"
  echo "$root" > "$dir/BUILD_ROOT"
  git rev-parse HEAD > "$dir/COMMIT" 2>/dev/null || echo unknown > "$dir/COMMIT"
  du -sh "$dir"
  echo "packed $dir: carry it to the GPU machine and run scripts/gpu-check.sh --prebuilt"
  exit 0
fi

# From here on: a GPU must be there.
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu-check: no GPU on this machine (nvidia-smi finds none); nothing was run" >&2
  exit 1
fi
device="$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -1)"

# NVRTC and the CUDA headers: given, packed, from .venv, or the CUDA toolkit's.
if [ -z "${FUSEBOX_NVRTC_LIB:-}" ]; then
  if [ -f "$dir/nvrtc-cu13.tar.xz" ]; then
    nv="$(mktemp -d)"
    tar -C "$nv" -xJf "$dir/nvrtc-cu13.tar.xz"
    export FUSEBOX_NVRTC_LIB="$nv/lib/libnvrtc.so.13" FUSEBOX_CUDA_INCLUDE="$nv/include"
  elif [ -x .venv/bin/python ]; then
    site="$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    if [ -f "$site/nvidia/cu13/lib/libnvrtc.so.13" ]; then
      export FUSEBOX_NVRTC_LIB="$site/nvidia/cu13/lib/libnvrtc.so.13"
      export FUSEBOX_CUDA_INCLUDE="$site/nvidia/cu13/include"
    fi
  fi
fi
export FUSEBOX_REQUIRE_GPU=1 FUSEBOX_REQUIRE_NVRTC=1
FUSEBOX_CACHE_DIR="$(mktemp -d)"
export FUSEBOX_CACHE_DIR

if [ "$mode" = "prebuilt" ]; then
  commit="$(cat "$dir/COMMIT" 2>/dev/null || echo unknown)"
  if [ ! -d "$dir/bin" ]; then
    tar -C "$dir" -xJf "$dir/bin.tar.xz"
  fi
  # The binaries find their data by the absolute paths they were built under.
  built="$(cat "$dir/BUILD_ROOT")"
  if [ "$built" != "$root" ] && [ ! -e "$built" ]; then
    mkdir -p "$(dirname "$built")"
    ln -s "$root" "$built"
  fi
  mkdir -p "$built/target/release"
  cp "$dir/bin/fusebox" "$built/target/release/fusebox"
else
  commit="$(git rev-parse HEAD 2>/dev/null || echo unknown)"
fi

log="target/gpu-check.log"
mkdir -p target
: > "$log"
failed=()
summary=()
for t in "${tests[@]}"; do
  pkg="${t%%:*}" name="${t#*:}"
  echo "== test $pkg --test $name" | tee -a "$log"
  one="$(mktemp)"
  if [ "$mode" = "prebuilt" ]; then
    crate_dir="$root"
    [ "$pkg" != fusebox ] && crate_dir="$root/backends/${pkg#fusebox-}"
    set +e
    (cd "$crate_dir" && "$root/$dir/bin/$pkg--$name" --test-threads=1 --nocapture) 2>&1 | tee -a "$log" "$one"
    rc=${PIPESTATUS[0]}
    set -e
  else
    set +e
    cargo test --release --locked -p "$pkg" --test "$name" -- --test-threads=1 --nocapture 2>&1 | tee -a "$log" "$one"
    rc=${PIPESTATUS[0]}
    set -e
  fi
  line="$(grep -E '^test result:' "$one" | tail -1)"
  rm -f "$one"
  summary+=("| \`$pkg --test $name\` | ${line:-no result line} |")
  [ "$rc" -ne 0 ] && failed+=("$pkg --test $name")
done

bench_out="$(mktemp)"
for b in "${benches[@]}"; do
  pkg="${b%%:*}" name="${b#*:}"
  echo "== bench $pkg --example $name" | tee -a "$log" "$bench_out"
  set +e
  if [ "$mode" = "prebuilt" ]; then
    "$root/$dir/bin/$pkg--$name" 2>&1 | tee -a "$log" "$bench_out"
    rc=${PIPESTATUS[0]}
  else
    cargo run --release --locked -p "$pkg" --example "$name" 2>&1 | tee -a "$log" "$bench_out"
    rc=${PIPESTATUS[0]}
  fi
  set -e
  [ "$rc" -ne 0 ] && failed+=("bench $pkg $name")
done

{
  echo
  echo "## GPU check, $(date -u +%Y-%m-%d) (scripts/gpu-check.sh${1:+ $1})"
  echo
  echo "Device: $device. Commit: \`$commit\`. NVRTC: ${FUSEBOX_NVRTC_LIB:-from the CUDA toolkit}."
  echo
  echo "| tests (FUSEBOX_REQUIRE_GPU=1) | result |"
  echo "|---|---|"
  printf '%s\n' "${summary[@]}"
  echo
  echo "Benchmarks (each a ratio against a baseline of the same run):"
  echo
  echo '```'
  grep -vE '^\s*(Compiling|Finished|Running|warning)' "$bench_out" || true
  echo '```'
  if [ "${#failed[@]}" -gt 0 ]; then
    echo
    echo "Failed: ${failed[*]} (log: target/gpu-check.log)."
  fi
} >> bench/RESULTS.md
rm -f "$bench_out"

if [ "${#failed[@]}" -gt 0 ]; then
  echo "gpu-check: failed: ${failed[*]}" >&2
  exit 1
fi
echo "gpu-check: every GPU test passed; figures appended to bench/RESULTS.md"
