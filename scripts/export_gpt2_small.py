#!/usr/bin/env python3
"""GPT-2 small (124 M parameters, seeded random weights) exported by the dynamo exporter with
its weights as ONNX external data, plus an input and onnxruntime's logits: the check that a
model over the size of our fixtures runs from its folder.

Run by hand with the export venv of `scripts/export_hf_models.py` (torch, transformers,
onnxscript, onnxruntime; CI never runs this: 500 MB of weights do not belong in the repo):

    .venv-export/bin/python scripts/export_gpt2_small.py OUT_DIR
    cargo run --release -- run OUT_DIR/model --config configs/cpu.toml --check \\
        --input input_ids=OUT_DIR/input_ids.npy --input attention_mask=OUT_DIR/attention_mask.npy \\
        --output-dir OUT_DIR/fusebox
    .venv/bin/python tests/ort/compare.py OUT_DIR/logits.npy OUT_DIR/fusebox/logits.npy

It writes OUT_DIR/model/model.onnx + OUT_DIR/model/model.onnx.data (the external data),
OUT_DIR/input_ids.npy and attention_mask.npy (batch 1, 32 tokens, seeded) and
OUT_DIR/logits.npy (onnxruntime's). Nothing is downloaded but packages: the model is
`GPT2Config()` (the gpt2 checkpoint's shape) with random weights, seed 0.
"""

import os
import sys

import numpy as np
import onnx
import onnxruntime as ort
import torch
from transformers import GPT2Config, GPT2LMHeadModel


class Wrapper(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False,
                         return_dict=True)
        return out.logits


def main() -> int:
    out = sys.argv[1]
    mdir = os.path.join(out, "model")
    os.makedirs(mdir, exist_ok=True)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config()).eval()
    n = sum(p.numel() for p in model.parameters())
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 50257, size=(1, 32), dtype=np.int64)
    mask = np.ones((1, 32), dtype=np.int64)
    w = Wrapper(model)
    batch = torch.export.Dim("batch", min=1, max=16)
    seq = torch.export.Dim("sequence", min=2, max=1024)
    dims = {0: batch, 1: seq}
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
    path = os.path.join(mdir, "model.onnx")
    program.save(path, external_data=True)
    m = onnx.load(path, load_external_data=False)
    ext = sum(1 for t in m.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL)
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    (got,) = sess.run(["logits"], {"input_ids": ids, "attention_mask": mask})
    np.save(os.path.join(out, "input_ids.npy"), ids)
    np.save(os.path.join(out, "attention_mask.npy"), mask)
    np.save(os.path.join(out, "logits.npy"), got)
    sizes = {f: os.path.getsize(os.path.join(mdir, f)) for f in sorted(os.listdir(mdir))}
    print(f"GPT-2 small: {n / 1e6:.1f} M parameters; {ext} initializers external; files {sizes}")
    print(f"onnxruntime vs torch: max |diff| {float(np.abs(got - want).max()):.3e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
