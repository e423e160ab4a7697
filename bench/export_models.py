#!/usr/bin/env python3
"""Exports the full-size models of `bench/models.sh` (issue 19's speed table) with seeded random
weights, each with its inputs and onnxruntime's outputs.

Run by hand with the export venv of `scripts/export_hf_models.py` (torch, torchvision,
transformers, onnxscript, onnxruntime; CI never runs this: the weights are hundreds of MB):

    .venv-export/bin/python bench/export_models.py OUT_DIR [MODEL ...]

MODEL is any of bert-base, gpt2, mobilenet-v2, mixtral-moe, deberta-v3-base, vit-base,
llama-small, xlnet-base, mobilenet-v3-large, efficientnet-b0, convnext-tiny, densenet-121
(default: all). Nothing is downloaded but
packages: every model is built from its default config (the published checkpoint's shape) with
random weights after `torch.manual_seed(0)`; token ids and pixels come from seeded numpy
generators. Per model, OUT_DIR/<model>/ holds:

    model/model.onnx (+ model.onnx.data for GPT-2: ONNX external data)
    inputs/<graph input>.npy
    outputs/<graph output>.npy     onnxruntime's outputs (CPU provider)
    export.txt                     exporter, opset, parameter count, onnxruntime vs torch

| model        | exporter                     | inputs                                       |
|--------------|------------------------------|----------------------------------------------|
| bert-base    | TorchScript, opset 17        | input_ids, attention_mask, token_type_ids [1, 128] |
| gpt2         | dynamo, opset 18, ext. data  | input_ids, attention_mask [1, 128]           |
| mobilenet-v2 | TorchScript, opset 17        | pixel_values [1, 3, 224, 224] (torchvision)  |
| mixtral-moe  | TorchScript, opset 17        | input_ids, attention_mask [1, 128]           |

mixtral-moe is not in issue 19's table: a scaled-down Mixtral (hidden 512, 8 experts of
intermediate 1792, top-2, 2 layers) whose experts transformers exports as a per-token gather
of their weights (`experts_implementation="batched_mm"`; the grouped default does not export),
to measure the `cpu.moe_silu_gated` fusion against onnxruntime running the same graph.
deberta-v3-base (not in the table either: `DebertaV2Model` with microsoft/deberta-v3-base's
shape, random weights, TorchScript, opset 17) measures `cpu.attention_reshaped`.

mobilenet-v3-large, efficientnet-b0, convnext-tiny and densenet-121 are torchvision's
(TorchScript, opset 17, `pixel_values [1, 3, 224, 224]`, batch-norm statistics calibrated as for
mobilenet-v2): the CNN families beyond the table (squeeze-excitation and hard-swish, SiLU,
7×7 depthwise with LayerNorm, concatenation).

The light ResNet-50 of the table is made by tests/ort/resnet50_random.py (no torch needed).
"""

import os
import sys

import numpy as np
import onnx
import onnxruntime as ort
import torch

SEQ = 128


class Logits(torch.nn.Module):
    """Returns the model's first output tensor only (no dict, no cache)."""

    def __init__(self, model, key):
        super().__init__()
        self.model = model
        self.key = key

    def forward(self, *args):
        out = self.model(*args)
        if isinstance(out, torch.Tensor):
            return out
        return getattr(out, self.key)


def save(out, name, inputs, model_path, want, note):
    os.makedirs(os.path.join(out, "inputs"), exist_ok=True)
    os.makedirs(os.path.join(out, "outputs"), exist_ok=True)
    for k, v in inputs.items():
        np.save(os.path.join(out, "inputs", f"{k}.npy"), v)
    sess = ort.InferenceSession(model_path, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    got = sess.run(names, inputs)
    for n, g in zip(names, got):
        np.save(os.path.join(out, "outputs", f"{n}.npy"), g)
    err = float(np.abs(got[0] - want).max())
    text = f"{name}: {note}; outputs {names}; onnxruntime vs torch max |diff| {err:.3e}\n"
    with open(os.path.join(out, "export.txt"), "w") as f:
        f.write(text)
    print(text, end="")


def token_inputs(vocab):
    """Seeded token ids and an all-ones mask, `[1, SEQ]`."""
    rng = np.random.default_rng(0)
    ids = rng.integers(0, vocab, size=(1, SEQ), dtype=np.int64)
    return {"input_ids": ids, "attention_mask": np.ones((1, SEQ), dtype=np.int64)}


def export_encoder(out, name, model, inputs, note="", axes=None):
    """`model`'s `last_hidden_state` for `inputs` (graph input name -> array, in the forward's
    argument order), exported by TorchScript at opset 17 with dynamic axes (`axes`, input
    name -> {axis: name}; by default batch and sequence), and saved with onnxruntime's
    outputs."""
    n = sum(p.numel() for p in model.parameters())
    w = Logits(model, "last_hidden_state")
    names = list(inputs)
    args = tuple(torch.from_numpy(inputs[k]) for k in names)
    path = os.path.join(out, "model", "model.onnx")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with torch.no_grad():
        want = w(*args).numpy()
        torch.onnx.export(
            w,
            args,
            path,
            dynamo=False,
            opset_version=17,
            input_names=names,
            output_names=["last_hidden_state"],
            dynamic_axes=axes or {k: {0: "batch", 1: "sequence"} for k in names},
        )
    save(out, name, inputs, path, want,
         f"TorchScript exporter, opset 17, {n / 1e6:.1f} M parameters{note}")


def bert(out):
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    model = BertModel(BertConfig()).eval()
    inputs = token_inputs(30522)
    inputs["token_type_ids"] = np.zeros((1, SEQ), dtype=np.int64)
    export_encoder(out, "bert-base", model, inputs)


def gpt2(out):
    from transformers import GPT2Config, GPT2LMHeadModel

    class Wrapper(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask):
            return self.model(input_ids=input_ids, attention_mask=attention_mask,
                              use_cache=False, return_dict=True).logits

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config()).eval()
    n = sum(p.numel() for p in model.parameters())
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 50257, size=(1, SEQ), dtype=np.int64)
    mask = np.ones((1, SEQ), dtype=np.int64)
    w = Wrapper(model)
    batch = torch.export.Dim("batch", min=1, max=16)
    seq = torch.export.Dim("sequence", min=2, max=1024)
    dims = {0: batch, 1: seq}
    path = os.path.join(out, "model", "model.onnx")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with torch.no_grad():
        want = w(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()
        program = torch.onnx.export(
            w,
            (torch.from_numpy(ids), torch.from_numpy(mask)),
            dynamo=True,
            opset_version=18,
            input_names=["input_ids", "attention_mask"],
            output_names=["logits"],
            dynamic_shapes={"input_ids": dims, "attention_mask": dims},
            external_data=True,
        )
    program.save(path, external_data=True)
    m = onnx.load(path, load_external_data=False)
    ext = sum(1 for t in m.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL)
    save(out, "gpt2", {"input_ids": ids, "attention_mask": mask}, path, want,
         f"dynamo exporter, opset 18, {n / 1e6:.1f} M parameters, {ext} initializers external")


def torchvision_cnn(out, name, arch):
    """torchvision's `arch` with random weights at 224 × 224, batch 1 (dynamic batch axis)."""
    import torchvision

    torch.manual_seed(0)
    model = getattr(torchvision.models, arch)(weights=None)
    n = sum(p.numel() for p in model.parameters())
    rng = np.random.default_rng(0)
    # Random weights with the batch-norm statistics of fresh init (mean 0, var 1) shrink the
    # activations layer by layer to ~1e-9 logits, which checks nothing: calibrate the running
    # statistics on a few seeded random batches first (cumulative averages), as a trained
    # network's would be.
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.reset_running_stats()
            m.momentum = None
    model.train()
    with torch.no_grad():
        for _ in range(4):
            model(torch.from_numpy(rng.standard_normal((8, 3, 224, 224), dtype=np.float32)))
    model.eval()
    x = rng.standard_normal((1, 3, 224, 224), dtype=np.float32)
    path = os.path.join(out, "model", "model.onnx")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with torch.no_grad():
        want = model(torch.from_numpy(x)).numpy()
        torch.onnx.export(
            model,
            (torch.from_numpy(x),),
            path,
            dynamo=False,
            opset_version=17,
            input_names=["pixel_values"],
            output_names=["logits"],
            dynamic_axes={"pixel_values": {0: "batch"}},
        )
    save(out, name, {"pixel_values": x}, path, want,
         f"TorchScript exporter, opset 17, torchvision {arch}, {n / 1e6:.1f} M parameters")


def mobilenet(out):
    torchvision_cnn(out, "mobilenet-v2", "mobilenet_v2")


def mixtral_moe(out):
    from transformers import MixtralConfig, MixtralModel

    torch.manual_seed(0)
    config = MixtralConfig(
        vocab_size=32000,
        hidden_size=512,
        intermediate_size=1792,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=2,
        num_local_experts=8,
        num_experts_per_tok=2,
        max_position_embeddings=1024,
        experts_implementation="batched_mm",
    )
    model = MixtralModel(config).eval()
    export_encoder(out, "mixtral-moe", model, token_inputs(32000), ", 8 experts, top-2")


def deberta_v3_base(out):
    from transformers import DebertaV2Config, DebertaV2Model

    torch.manual_seed(0)
    # microsoft/deberta-v3-base's config.json, written out (nothing is downloaded).
    config = DebertaV2Config(
        vocab_size=128100,
        hidden_size=768,
        num_hidden_layers=12,
        num_attention_heads=12,
        intermediate_size=3072,
        hidden_act="gelu",
        max_position_embeddings=512,
        type_vocab_size=0,
        relative_attention=True,
        max_relative_positions=-1,
        position_buckets=256,
        norm_rel_ebd="layer_norm",
        share_att_key=True,
        pos_att_type=["p2c", "c2p"],
        position_biased_input=False,
        layer_norm_eps=1e-7,
    )
    model = DebertaV2Model(config).eval()
    export_encoder(out, "deberta-v3-base", model, token_inputs(128100))


def vit_base(out):
    from transformers import ViTConfig, ViTModel

    torch.manual_seed(0)
    # google/vit-base-patch16-224's shape: 12 layers, hidden 768, 224 × 224 in 16 × 16
    # patches (197 tokens); random weights.
    model = ViTModel(ViTConfig(), add_pooling_layer=False).eval()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 3, 224, 224), dtype=np.float32)
    export_encoder(out, "vit-base", model, {"pixel_values": x},
                   axes={"pixel_values": {0: "batch"}})


def llama_small(out):
    from transformers import LlamaConfig, LlamaModel

    torch.manual_seed(0)
    # A LLaMA-architecture model of BERT-base's width: 12 layers, hidden 768, 12 query and
    # 4 key/value heads (grouped-query attention), SwiGLU MLP of 2048, RoPE, RMSNorm.
    config = LlamaConfig(
        vocab_size=32000,
        hidden_size=768,
        intermediate_size=2048,
        num_hidden_layers=12,
        num_attention_heads=12,
        num_key_value_heads=4,
        max_position_embeddings=1024,
    )
    model = LlamaModel(config).eval()
    export_encoder(out, "llama-small", model, token_inputs(32000), ", grouped-query attention")


def xlnet_base(out):
    from transformers import XLNetConfig, XLNetModel

    torch.manual_seed(0)
    # xlnet-base-cased's shape (12 layers, d_model 768, 12 heads, d_inner 3072; XLNetConfig's
    # defaults are the large model's), random weights. Its relative attention (einsums, the
    # relative shift) is not one of the fused attention forms: it measures the unfused path.
    model = XLNetModel(
        XLNetConfig(d_model=768, n_layer=12, n_head=12, d_inner=3072)
    ).eval()
    export_encoder(out, "xlnet-base", model, token_inputs(32000), ", relative attention")


MODELS = {
    "bert-base": bert,
    "gpt2": gpt2,
    "mobilenet-v2": mobilenet,
    "mobilenet-v3-large": lambda out: torchvision_cnn(out, "mobilenet-v3-large", "mobilenet_v3_large"),
    "efficientnet-b0": lambda out: torchvision_cnn(out, "efficientnet-b0", "efficientnet_b0"),
    "convnext-tiny": lambda out: torchvision_cnn(out, "convnext-tiny", "convnext_tiny"),
    "densenet-121": lambda out: torchvision_cnn(out, "densenet-121", "densenet121"),
    "mixtral-moe": mixtral_moe,
    "deberta-v3-base": deberta_v3_base,
    "vit-base": vit_base,
    "llama-small": llama_small,
    "xlnet-base": xlnet_base,
}


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    out = sys.argv[1]
    names = sys.argv[2:] or list(MODELS)
    for name in names:
        if name not in MODELS:
            print(f"unknown model `{name}`; expected one of {', '.join(MODELS)}", file=sys.stderr)
            return 2
        MODELS[name](os.path.join(out, name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
