#!/usr/bin/env python3
"""Today's models on a GPU, end to end through `configs/cuda.toml` (hand-run; never in CI).

Two parts, each one line per model to stdout and to `--log`:

  fixtures  every `tests/models/<family>-<exporter>/` fixture (the tiny seeded Hugging Face
            models of `tests/hf_models.rs`), its largest input set, its symbolic dims bound to
            the inputs' shapes (`--bind`, which the GPU backends need), run by `fusebox run
            --config configs/cuda.toml`; each output compared with the fixture's onnxruntime
            output: max |got - want| / (max(want) - min(want)). Needs numpy only.
  export    (`--export DIR`) full-size models built with random weights (torch.manual_seed,
            nothing downloaded) and exported by the TorchScript exporter at batch 1 with static
            shapes: torchvision MobileNetV2 and ResNet-50 (224x224), transformers BERT-base and
            GPT-2 small (sequence 128). Each runs through the CUDA config and through the CPU
            reference (`fusebox run` without a config), and is compared with torch's own fp32
            output on the CPU. Timing: fusebox's `time run` (median of `--repeat` runs after a
            warm-up, outputs copied back to the host) against torch eager fp32 on the same GPU
            (TF32 off for matmul and cuDNN; median of the same number of runs, synchronised,
            input on the device), the named baseline. Needs torch, torchvision, transformers.

    python3 bench/gpu_models.py --fusebox target/release/fusebox [--export /tmp/gm] \
        [--repeat 20] [--log target/gpu-models.log]

Exit status 1 if any fixture or model fails to run or is off by more than 1e-3 of its range.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
TOL = 1e-3
LOG: list[str] = []
LOG_PATH: Path | None = None


def say(line: str) -> None:
    print(line, flush=True)
    LOG.append(line)
    if LOG_PATH is not None:
        LOG_PATH.write_text("\n".join(LOG) + "\n")


def signature(fusebox: str, model: Path) -> list[tuple[str, list[str]]]:
    """`main`'s parameters as (name, dims) from `fusebox show` (dims as written: ints or names)."""
    out = subprocess.run(
        [fusebox, "show", str(model)], capture_output=True, text=True, timeout=300
    )
    if out.returncode != 0:
        raise RuntimeError(f"show: {out.stderr.strip()[:300]}")
    line = next(l for l in out.stdout.splitlines() if "def main(" in l)
    head = line.split(") ->")[0]
    return [
        (name, [d.strip().strip('"') for d in dims.split(",") if d.strip()])
        for name, dims in re.findall(r"(\w+): R\.Tensor\(\(([^)]*)\)", head)
    ]


def sanitize(name: str) -> str:
    return re.sub(r"\W", "_", name)


def bindings(sig, inputs: dict[str, np.ndarray]) -> list[str]:
    """`--bind NAME=VALUE` for each symbolic dim, from the shape of the input that carries it."""
    by_name = {sanitize(k): v for k, v in inputs.items()}
    binds: dict[str, int] = {}
    for name, dims in sig:
        a = by_name.get(name)
        if a is None:
            continue
        for d, n in zip(dims, a.shape):
            if not d.lstrip("-").isdigit() and re.fullmatch(r"\w+", d):
                binds.setdefault(d, int(n))
    out: list[str] = []
    for k, v in binds.items():
        out += ["--bind", f"{k}={v}"]
    return out


def run_fusebox(fusebox, model, inputs, binds, out_dir, config, repeat, env):
    """Runs one model; returns ({output name: array}, run ms, wall seconds)."""
    cmd = [fusebox, "run", str(model), "--output-dir", str(out_dir), "--timings"]
    cmd += ["--repeat", str(repeat)] + binds
    if config:
        cmd += ["--config", config]
    for name, path in inputs.items():
        cmd += ["--input", f"{name}={path}"]
    t0 = time.time()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    wall = time.time() - t0
    if out.returncode != 0:
        raise RuntimeError(out.stderr.strip().splitlines()[-1][:400] if out.stderr.strip() else "exit " + str(out.returncode))
    m = re.search(r"time run ([0-9.]+) ms", out.stderr)
    ms = float(m.group(1)) if m else float("nan")
    outs = {p.stem: np.load(p) for p in sorted(Path(out_dir).glob("*.npy"))}
    return outs, ms, wall


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        raise RuntimeError(f"shape {got.shape}, want {want.shape}")
    span = float(want.max() - want.min()) or 1.0
    return float(np.abs(got - want).max()) / span


def fixtures(args, env) -> int:
    failed = 0
    dirs = sorted(p for p in (ROOT / "tests" / "models").iterdir() if (p / "model.onnx").exists())
    say(f"== fixtures: {len(dirs)} from tests/models, {args.config}, tolerance {TOL} of the range")
    passed = 0
    for d in dirs:
        try:
            sets = [s for s in ("seq128", "default", "seq64", "seq8") if (d / s / "inputs").is_dir()]
            if not sets:
                raise RuntimeError("no input set (seq128, default, seq64 or seq8)")
            s = d / sets[0]
            inputs = {p.stem: p for p in sorted((s / "inputs").glob("*.npy"))}
            arrays = {k: np.load(v) for k, v in inputs.items()}
            binds = bindings(signature(args.fusebox, d / "model.onnx"), arrays)
            out_dir = Path(args.work) / "fx" / d.name
            out_dir.mkdir(parents=True, exist_ok=True)
            for old in out_dir.glob("*.npy"):
                old.unlink()
            got, ms, wall = run_fusebox(
                args.fusebox, d / "model.onnx", inputs, binds, out_dir, args.config, 3, env
            )
            worst = 0.0
            for p in sorted((s / "outputs").glob("*.npy")):
                key = p.stem if p.stem in got else sanitize(p.stem)
                if key not in got:
                    raise RuntimeError(f"no output {p.stem} (got {sorted(got)})")
                worst = max(worst, rel_err(got[key], np.load(p)))
            ok = worst <= TOL
            passed += ok
            failed += not ok
            say(
                f"fixture {d.name} [{sets[0]}, {' '.join(binds[1::2]) or 'static'}]: "
                f"{'pass' if ok else 'FAIL'} max err {worst:.2e} of range; run {ms:.3f} ms; wall {wall:.1f} s"
            )
        except Exception as e:  # noqa: BLE001 - one line per fixture, then go on
            failed += 1
            say(f"fixture {d.name}: FAIL {type(e).__name__}: {e}")
    say(f"fixtures through {args.config}: {passed}/{len(dirs)} pass")
    return failed


def export_models(dest: Path):
    """Builds and exports the full-size models; yields (name, onnx path, {input: array}, torch
    module, torch inputs)."""
    import torch
    import torchvision
    import transformers

    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    image = rng.uniform(-1, 1, (1, 3, 224, 224)).astype(np.float32)
    ids = rng.integers(0, 1000, (1, 128)).astype(np.int64)
    mask = np.ones((1, 128), dtype=np.int64)

    class Text(torch.nn.Module):
        def __init__(self, m, field):
            super().__init__()
            self.m, self.field = m, field

        def forward(self, input_ids, attention_mask):
            return getattr(self.m(input_ids=input_ids, attention_mask=attention_mask), self.field)

    cfg_bert = transformers.BertConfig(attn_implementation="eager")
    cfg_gpt2 = transformers.GPT2Config(attn_implementation="eager", use_cache=False)
    models = [
        ("mobilenet-v2", lambda: torchvision.models.mobilenet_v2(weights=None), {"pixel_values": image}, "logits"),
        ("resnet-50", lambda: torchvision.models.resnet50(weights=None), {"pixel_values": image}, "logits"),
        ("bert-base", lambda: Text(transformers.BertModel(cfg_bert), "last_hidden_state"),
         {"input_ids": ids, "attention_mask": mask}, "last_hidden_state"),
        ("gpt2-small", lambda: Text(transformers.GPT2LMHeadModel(cfg_gpt2), "logits"),
         {"input_ids": ids, "attention_mask": mask}, "logits"),
    ]
    for name, build, inputs, output in models:
        d = dest / name
        d.mkdir(parents=True, exist_ok=True)
        model = build().eval()
        calibrate_batch_norm(model)
        t_in = tuple(torch.from_numpy(v) for v in inputs.values())
        path = d / "model.onnx"
        with torch.no_grad():
            torch.onnx.export(
                model, t_in, str(path), input_names=list(inputs), output_names=[output],
                opset_version=17, dynamo=False,
            )
        paths = {}
        for k, v in inputs.items():
            np.save(d / f"{k}.npy", v)
            paths[k] = d / f"{k}.npy"
        yield name, path, paths, model, t_in, output


def calibrate_batch_norm(model) -> None:
    """Running statistics of one seeded batch for every BatchNorm (as
    scripts/export_hf_models.py does): with fresh statistics a deep random CNN's activations
    shrink layer by layer (MobileNetV2's logits come out below 1e-6), which compares nothing."""
    import torch

    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if not norms:
        return
    gen = torch.Generator().manual_seed(1)
    for m in norms:
        with torch.no_grad():
            m.weight.copy_(torch.rand(m.weight.shape, generator=gen) + 0.5)
            m.bias.copy_(torch.rand(m.bias.shape, generator=gen) * 0.4 - 0.2)
        m.reset_running_stats()
        m.momentum = None
        m.train()
    with torch.no_grad():
        model(torch.rand((8, 3, 224, 224), generator=gen) * 2 - 1)
    model.eval()


def torch_time(model, t_in, repeat: int) -> tuple[float, np.ndarray, str]:
    """torch's fp32 output on the CPU, and its eager median time on the GPU (on the CPU where
    there is none, so that the script can be tried without one)."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    with torch.no_grad():
        ref = model(*t_in).numpy()
        m = model.to(dev)
        x = tuple(t.to(dev) for t in t_in)
        m(*x)
        sync()
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            m(*x)
            sync()
            times.append((time.perf_counter() - t0) * 1e3)
        m.cpu()
    return float(np.median(times)), ref, dev


def exported(args, env) -> int:
    failed = 0
    say(f"== full-size models (random weights, batch 1), {args.repeat} timed runs each")
    try:
        gen = export_models(Path(args.export))
        for name, path, inputs, model, t_in, output in gen:
            try:
                base_ms, ref, dev = torch_time(model, t_in, args.repeat)
                work = Path(args.work) / name
                gpu, ms, wall = run_fusebox(
                    args.fusebox, path, inputs, [], work / "gpu", args.config, args.repeat, env
                )
                cpu, cpu_ms, _ = run_fusebox(args.fusebox, path, inputs, [], work / "cpu", None, 1, env)
                e_gpu = rel_err(gpu[output], ref)
                e_cpu = rel_err(cpu[output], ref)
                e_gc = rel_err(gpu[output], cpu[output])
                ok = max(e_gpu, e_gc) <= TOL
                failed += not ok
                say(
                    f"model {name}: {'pass' if ok else 'FAIL'} (output in [{ref.min():.3g}, "
                    f"{ref.max():.3g}]); fusebox ({args.config}) {ms:.3f} ms, "
                    f"torch eager {dev} fp32 {base_ms:.3f} ms, ratio {ms / base_ms:.2f} "
                    f"(fusebox/torch); max err / range against torch on the CPU: fusebox with "
                    f"the config {e_gpu:.2e}, fusebox CPU reference {e_cpu:.2e}; the two "
                    f"fusebox runs {e_gc:.2e}; CPU reference run {cpu_ms:.1f} ms; wall {wall:.1f} s"
                )
            except Exception as e:  # noqa: BLE001
                failed += 1
                say(f"model {name}: FAIL {type(e).__name__}: {str(e)[:400]}")
    except Exception as e:  # noqa: BLE001
        failed += 1
        say(f"export: FAIL {type(e).__name__}: {str(e)[:400]}")
    return failed


def main() -> None:
    global LOG_PATH
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--fusebox", default=str(ROOT / "target" / "release" / "fusebox"))
    p.add_argument("--export", help="export the full-size models into this folder and run them")
    p.add_argument("--no-fixtures", action="store_true")
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--config", default="configs/cuda.toml", help="the config under test")
    p.add_argument("--work", default=str(ROOT / "target" / "gpu-models"))
    p.add_argument("--log", default=str(ROOT / "target" / "gpu-models.log"))
    args = p.parse_args()
    LOG_PATH = Path(args.log)
    LOG_PATH.parent.mkdir(parents=True, exist_ok=True)
    os.chdir(ROOT)
    env = dict(os.environ)
    failed = 0
    if not args.no_fixtures:
        failed += fixtures(args, env)
    if args.export:
        failed += exported(args, env)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
