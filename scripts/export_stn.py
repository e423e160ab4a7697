"""A spatial transformer (torch's affine_grid + grid_sample in three modes) exported by both
torch exporters, as fixtures for tests/hf_models.rs: tests/models/stn-ts and stn-dynamo.

Not a Hugging Face model: a small seeded module (a conv + pool + linear localisation net
predicting the 2x3 affine theta, then bilinear/zeros, bicubic/reflection and nearest/border
samples of the input combined), the pattern of spatial transformer networks and of the
deformable-attention heads that call grid_sample. TorchScript needs opset 20 (AffineGrid);
dynamo writes opset 20 too. onnxruntime's outputs (CPU provider, 1 thread) are the reference.

Run with the export venv of scripts/export_hf_models.py:
    .venv-export/bin/python scripts/export_stn.py
"""
import os

import numpy as np
import onnxruntime as ort
import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "models")


class STN(nn.Module):
    def __init__(self):
        super().__init__()
        self.loc = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
            nn.Linear(8, 6))
        with torch.no_grad():
            self.loc[-1].weight.mul_(0.1)
            self.loc[-1].bias.copy_(torch.tensor([1.0, 0, 0, 0, 1.0, 0]))

    def forward(self, x):
        theta = self.loc(x).view(-1, 2, 3)
        g = F.affine_grid(theta, list(x.shape), align_corners=False)
        a = F.grid_sample(x, g, mode="bilinear", padding_mode="zeros", align_corners=False)
        b = F.grid_sample(x, g * 1.3, mode="bicubic", padding_mode="reflection",
                          align_corners=True)
        c = F.grid_sample(x, g, mode="nearest", padding_mode="border", align_corners=False)
        return a + b - c


def main():
    torch.manual_seed(0)
    model = STN().eval()
    x = np.random.default_rng(0).standard_normal((2, 3, 16, 20)).astype(np.float32)
    for suffix, dynamo in [("ts", False), ("dynamo", True)]:
        out = os.path.join(ROOT, f"stn-{suffix}")
        os.makedirs(os.path.join(out, "default", "inputs"), exist_ok=True)
        os.makedirs(os.path.join(out, "default", "outputs"), exist_ok=True)
        path = os.path.join(out, "model.onnx")
        if dynamo:
            torch.onnx.export(model, (torch.from_numpy(x),), path, dynamo=True,
                              opset_version=20, external_data=False)
        else:
            torch.onnx.export(model, (torch.from_numpy(x),), path, dynamo=False,
                              opset_version=20, input_names=["x"])
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
        name = sess.get_inputs()[0].name
        np.save(os.path.join(out, "default", "inputs", f"{name}.npy"), x)
        for o, v in zip(sess.get_outputs(), sess.run(None, {name: x})):
            np.save(os.path.join(out, "default", "outputs", f"{o.name}.npy"), v)
        with torch.no_grad():
            err = float(np.abs(model(torch.from_numpy(x)).numpy() - v).max())
        print(f"stn-{suffix}: {os.path.getsize(path)} bytes, torch vs onnxruntime {err:.2e}")


if __name__ == "__main__":
    main()
