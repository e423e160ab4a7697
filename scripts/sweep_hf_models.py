#!/usr/bin/env python3
"""Export more Hugging Face families than the committed fixtures hold and check fusebox on them.

A hand-run sweep for import gaps (CI never runs it: it needs torch and transformers). It builds
each family below exactly as `scripts/export_hf_models.py` builds the committed fixtures (tiny
config, seeded random weights, both torch exporters, onnxruntime's outputs checked against
torch's), writes them under `target/hf-sweep/` (git-ignored, not committed), then runs

    target/release/fusebox run --config configs/cpu.toml <model.onnx> --check --input ...

on every input set and compares each output with onnxruntime's as `tests/hf_models.rs` does
(max |got - want| <= 1e-4 of the output range). It prints one line per fixture and a summary,
and writes them to `target/hf-sweep/results.txt`.

    # .venv-export/ is what scripts/export_hf_models.py creates on its first run
    cargo build --release -p fusebox
    .venv-export/bin/python scripts/sweep_hf_models.py           # every family (~10 min)
    .venv-export/bin/python scripts/sweep_hf_models.py phi3 opt  # only these

A family that fails here and passes once fixed belongs in `export_hf_models.py` as a committed
fixture (DeBERTa-v2, BART, XLNet, DINOv2, Swin V2, SegFormer and MobileViT came that way).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv-export"
if Path(sys.prefix).resolve() != VENV.resolve():
    sys.exit(
        f"run me with {VENV}/bin/python (scripts/export_hf_models.py creates it on its first "
        "run)"
    )

# The export machinery (Family, build, export, write_fixture, main), unchanged.
_spec = importlib.util.spec_from_file_location("export_hf_models", ROOT / "scripts/export_hf_models.py")
exp = importlib.util.module_from_spec(_spec)
sys.modules["export_hf_models"] = exp
_argv, sys.argv = sys.argv, sys.argv[:1]
_spec.loader.exec_module(exp)
sys.argv = _argv

import numpy as np  # noqa: E402

tf, Family, VOCAB = exp.tf, exp.Family, exp.VOCAB


def text(name, cls, config_cls, output="last_hidden_state", **kw):
    """A text family: BERT-sized defaults, overridden (or dropped with None) by `kw`."""
    cfg = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
    )
    cfg.update(kw)
    cfg = {k: v for k, v in cfg.items() if v is not None}
    return Family(name, lambda: cls(config_cls(**cfg)), "text", output, name)


def image(name, build, output="logits"):
    return Family(name, build, "image", output, name, shape=(3, 32, 32))


SWEEP = [
    text("albert", tf.AlbertModel, tf.AlbertConfig, embedding_size=16, max_position_embeddings=256),
    text("electra", tf.ElectraModel, tf.ElectraConfig, embedding_size=16, max_position_embeddings=256),
    text("mpnet", tf.MPNetModel, tf.MPNetConfig, max_position_embeddings=258),
    text("mobilebert", tf.MobileBertModel, tf.MobileBertConfig, embedding_size=16,
         intra_bottleneck_size=16, true_hidden_size=16, num_feedforward_networks=2,
         max_position_embeddings=256),
    text("convbert", tf.ConvBertModel, tf.ConvBertConfig, embedding_size=32,
         max_position_embeddings=256),
    text("funnel", tf.FunnelBaseModel, tf.FunnelConfig, d_model=32, n_head=2, d_head=16,
         d_inner=64, block_sizes=[1, 1], num_decoder_layers=1, num_hidden_layers=None,
         num_attention_heads=None, hidden_size=None, intermediate_size=None),
    text("opt", tf.OPTForCausalLM, tf.OPTConfig, "logits", ffn_dim=64,
         max_position_embeddings=256, word_embed_proj_dim=32),
    text("bloom", tf.BloomForCausalLM, tf.BloomConfig, "logits", n_layer=2, n_head=2),
    text("falcon", tf.FalconForCausalLM, tf.FalconConfig, "logits",
         new_decoder_architecture=False, multi_query=True),
    text("phi", tf.PhiForCausalLM, tf.PhiConfig, "logits", max_position_embeddings=256),
    text("phi3", tf.Phi3ForCausalLM, tf.Phi3Config, "logits", num_key_value_heads=1,
         max_position_embeddings=256, pad_token_id=0),
    text("gemma", tf.GemmaForCausalLM, tf.GemmaConfig, "logits", num_key_value_heads=1,
         head_dim=16, max_position_embeddings=256),
    text("gemma2", tf.Gemma2ForCausalLM, tf.Gemma2Config, "logits", num_key_value_heads=1,
         head_dim=16, max_position_embeddings=256, sliding_window=32),
    text("stablelm", tf.StableLmForCausalLM, tf.StableLmConfig, "logits",
         num_key_value_heads=2, max_position_embeddings=256),
    text("gptj", tf.GPTJForCausalLM, tf.GPTJConfig, "logits", n_embd=32, n_layer=2, n_head=2,
         rotary_dim=8, n_positions=256),
    text("codegen", tf.CodeGenForCausalLM, tf.CodeGenConfig, "logits", n_embd=32, n_layer=2,
         n_head=2, rotary_dim=8, n_positions=256, n_ctx=256),
    text("mamba", tf.MambaForCausalLM, tf.MambaConfig, "logits", state_size=8, expand=2,
         conv_kernel=4),
    image("beit", lambda: tf.BeitForImageClassification(tf.BeitConfig(
        image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, num_labels=10, use_relative_position_bias=True))),
    image("levit", lambda: tf.LevitForImageClassification(tf.LevitConfig(
        image_size=32, hidden_sizes=[32, 48, 64], num_attention_heads=[1, 2, 2],
        depths=[1, 1, 1], key_dim=[8, 8, 8], num_labels=10))),
    image("poolformer", lambda: tf.PoolFormerForImageClassification(tf.PoolFormerConfig(
        hidden_sizes=[8, 16, 24, 32], depths=[1, 1, 1, 1], num_labels=10))),
    image("regnet", lambda: tf.RegNetForImageClassification(tf.RegNetConfig(
        embedding_size=8, hidden_sizes=[8, 16, 24, 32], depths=[1, 1, 1, 1], groups_width=8,
        num_labels=10))),
    image("convnextv2", lambda: tf.ConvNextV2ForImageClassification(tf.ConvNextV2Config(
        hidden_sizes=[8, 16, 24, 32], depths=[1, 1, 1, 1], num_labels=10))),
    image("clip-vision", lambda: tf.CLIPVisionModel(tf.CLIPVisionConfig(
        image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64)), "last_hidden_state"),
    image("siglip-vision", lambda: tf.SiglipVisionModel(tf.SiglipVisionConfig(
        image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64)), "last_hidden_state"),
    image("yolos", lambda: tf.YolosModel(tf.YolosConfig(
        image_size=[32, 32], patch_size=8, hidden_size=32, num_hidden_layers=2,
        num_attention_heads=2, intermediate_size=64, num_detection_tokens=4)),
        "last_hidden_state"),
    image("focalnet", lambda: tf.FocalNetForImageClassification(tf.FocalNetConfig(
        image_size=32, patch_size=2, embed_dim=16, depths=[1, 1], focal_levels=[2, 2],
        num_labels=10))),
    image("pvt", lambda: tf.PvtForImageClassification(tf.PvtConfig(
        image_size=32, num_encoder_blocks=2, depths=[1, 1], sequence_reduction_ratios=[2, 1],
        hidden_sizes=[16, 32], patch_sizes=[4, 2], strides=[4, 2], num_attention_heads=[1, 2],
        mlp_ratios=[2, 2], num_labels=10))),
    image("dpt", lambda: tf.DPTForDepthEstimation(tf.DPTConfig(
        image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=4, num_attention_heads=2,
        intermediate_size=64, backbone_out_indices=[0, 1, 2, 3],
        neck_hidden_sizes=[8, 16, 24, 32], fusion_hidden_size=16, head_hidden_size=8)),
        "predicted_depth"),
]

OUT = ROOT / "target" / "hf-sweep"
FUSEBOX = ROOT / "target" / "release" / "fusebox"


def check(d: Path) -> str:
    """fusebox's verdict on one exported fixture folder."""
    worst = 0.0
    for s in sorted(p for p in d.iterdir() if p.is_dir()):
        args = []
        for i in sorted((s / "inputs").glob("*.npy")):
            args += ["--input", f"{i.stem}={i}"]
        out = OUT / "out" / d.name / s.name
        r = subprocess.run(
            [str(FUSEBOX), "run", "--config", str(ROOT / "configs/cpu.toml"),
             str(d / "model.onnx"), "--output-dir", str(out), "--check", *args],
            capture_output=True, text=True, timeout=600,
        )
        if r.returncode != 0:
            last = (r.stderr.strip().splitlines() or ["(no message)"])[-1]
            return f"FAIL {s.name}: {last[:300]}"
        for w in sorted((s / "outputs").glob("*.npy")):
            want = np.load(w)
            got = np.load(out / w.name)
            err = float(np.abs(got.astype(np.float64) - want).max())
            scale = float(want.max() - want.min()) or 1.0
            if not err <= 1e-4 * scale:
                return f"FAIL {s.name}: max err {err:.3g} against an output range of {scale:.3g}"
            worst = max(worst, err)
    return f"pass (max err {worst:.3g})"


def main() -> None:
    if not FUSEBOX.exists():
        sys.exit(f"{FUSEBOX} is missing: cargo build --release -p fusebox")
    exp.OUT = OUT
    exp.FAMILIES = SWEEP
    exp.OPSET16 = set()
    exp.main()
    wanted = set(sys.argv[1:])
    lines = []
    for f in SWEEP:
        if wanted and f.name not in wanted:
            continue
        for e in exp.exporters(f):
            d = OUT / f"{f.name}-{e}"
            verdict = check(d) if (d / "model.onnx").exists() else "not exported (see exports.txt)"
            lines.append(f"{d.name}: {verdict}")
            print(lines[-1], flush=True)
    passed = sum(": pass" in line for line in lines)
    exported = sum("not exported" not in line for line in lines)
    summary = f"hf sweep: {passed}/{exported} exported fixtures pass ({len(lines)} tried)"
    print(summary)
    (OUT / "results.txt").write_text("\n".join(lines + [summary]) + "\n")


if __name__ == "__main__":
    main()
