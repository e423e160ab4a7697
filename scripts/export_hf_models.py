#!/usr/bin/env python3
"""Export small, seeded, randomly initialised Hugging Face models to ONNX with both torch
exporters, and write the fixtures of `tests/hf_models.rs` under `tests/models/`.

Run by hand (CI never runs it: torch and transformers are too heavy for CI):

    python3 scripts/export_hf_models.py            # every family
    python3 scripts/export_hf_models.py bert llama # only these families
    python3 scripts/export_hf_models.py bert:ts16  # one family, one exporter

The script makes its own virtual environment, `.venv-export/` at the repository root (separate
from CI's `.venv/`), installs the pinned packages below into it on first use, and re-runs itself
there. Nothing is downloaded but packages: every model is built from a tiny config with random
weights (`torch.manual_seed`), never fetched from the hub, and token ids, pixels and audio
features come from a seeded numpy generator (no tokenizer).

Pinned versions (what the committed fixtures were made with):

    torch 2.15.0 (PyPI's Linux wheel; PyPI has no CPU-only build, so it pulls the NVIDIA
                  runtime wheels, about 3 GB; the export runs on the CPU)
    torchvision 0.29.2 (MobileNetV3 only: transformers has no MobileNetV3)
    transformers 5.24.0
    onnx 1.23.2, onnx-ir 1.1.0, onnxscript 0.7.2 (the dynamo exporter)
    onnxruntime 1.32.0 (the reference outputs)
    numpy 2.4.6

For every family and each exporter, `ts` (TorchScript: `torch.onnx.export(dynamo=False,
opset_version=17)`) and `dynamo` (`torch.onnx.export(dynamo=True, opset_version=18)`, weights
kept inside the model file), and for the families of `OPSET16` a third, `ts16` (TorchScript at
opset 16, before ONNX had LayerNormalization: LayerNorm exported decomposed into
ReduceMean/Sub/Pow/Sqrt/Div), it writes

    tests/models/<family>-<ts|dynamo>/model.onnx
    tests/models/<family>-<ts|dynamo>/<set>/inputs/<graph input name>.npy
    tests/models/<family>-<ts|dynamo>/<set>/outputs/<graph output name>.npy   (onnxruntime's)

Text models have dynamic batch and sequence axes and three input sets: `seq8` (batch 2),
`seq64` (batch 2) and `seq128` (batch 1); the second row of a batch of 2 is right-padded (its
last quarter masked out in `attention_mask`). Image and audio models have a dynamic batch axis
and one set, `default` (batch 2). Each fixture is checked against torch's own output before it
is written. An export that fails leaves no folder for that fixture and its error goes to
`tests/models/exports.txt` (one line per family and exporter), which the README quotes.

Deterministic and idempotent: every fixture folder is removed and written anew from the same
seeds, so re-running rewrites the same files.
"""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv-export"
OUT = ROOT / "tests" / "models"
PINNED = [
    "torch==2.15.0",
    "torchvision==0.29.2",
    "transformers==5.24.0",
    "onnx==1.23.2",
    "onnx-ir==1.1.0",
    "onnxscript==0.7.2",
    "onnxruntime==1.32.0",
    "numpy==2.4.6",
]


def ensure_venv() -> None:
    """Creates `.venv-export/` with the pinned packages and re-runs this script inside it."""
    if Path(sys.prefix).resolve() == VENV.resolve():
        return
    python = VENV / "bin" / "python"
    stamp = VENV / "pinned.txt"
    if not python.exists():
        print(f"creating {VENV}", flush=True)
        venv.create(VENV, with_pip=True)
    if not stamp.exists() or stamp.read_text() != "\n".join(PINNED):
        subprocess.check_call([str(python), "-m", "pip", "install", "-q", "--upgrade", "pip"])
        subprocess.check_call([str(python), "-m", "pip", "install", "-q", *PINNED])
        stamp.write_text("\n".join(PINNED))
    os.execv(str(python), [str(python), __file__, *sys.argv[1:]])


ensure_venv()

# Everything below runs inside `.venv-export/`.
import re  # noqa: E402
import shutil  # noqa: E402
import traceback  # noqa: E402
import warnings  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from typing import Callable  # noqa: E402

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
import torch  # noqa: E402
import transformers as tf  # noqa: E402

warnings.filterwarnings("ignore")
torch.set_num_threads(1)

VOCAB = 128
# (set name, batch, sequence length) of the text models' input sets.
TEXT_SETS = [("seq8", 2, 8), ("seq64", 2, 64), ("seq128", 1, 128)]
# Batch and sequence length of the example the exporters trace (not 1: torch.export
# specialises dims of size 1).
TRACE_BATCH, TRACE_SEQ = 2, 16


class Wrapper(torch.nn.Module):
    """Calls a Hugging Face model with keyword inputs and returns one tensor of its output
    (`output`: the attribute of the model's output; None: the module returns a tensor)."""

    def __init__(self, model: torch.nn.Module, output: str | None):
        super().__init__()
        self.model = model
        self.output = output

    def call(self, **kwargs: torch.Tensor) -> torch.Tensor:
        if self.output is None:
            return self.model(*kwargs.values())
        if getattr(self.model.config, "use_cache", None) is not None:
            kwargs["use_cache"] = False
        return getattr(self.model(**kwargs, return_dict=True), self.output)


class TextWrapper(Wrapper):
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.call(input_ids=input_ids, attention_mask=attention_mask)


class Seq2SeqWrapper(Wrapper):
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.call(
            input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=input_ids
        )


class ValuesWrapper(Wrapper):
    def forward(self, input_values: torch.Tensor) -> torch.Tensor:
        return self.call(input_values=input_values)


class ImageWrapper(Wrapper):
    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.call(pixel_values=pixel_values)


class AudioWrapper(Wrapper):
    def forward(self, input_features: torch.Tensor) -> torch.Tensor:
        return self.call(input_features=input_features)


@dataclass
class Family:
    """One model family: how to build it, its inputs, and its output."""

    name: str
    build: Callable[[], torch.nn.Module]
    # "text" (input_ids + attention_mask), "seq2seq" (the same, also fed to the decoder as
    # decoder_input_ids), "image" (pixel_values), "audio" (input_features) or "values"
    # (input_values: raw waveforms or spectrograms)
    kind: str
    output: str | None  # the model output's attribute (None: the module returns a tensor)
    what: str  # what the fixture exercises (for the README)
    # (channels, height, width) of an image, or (mel bins, frames) of audio features.
    shape: tuple[int, ...] = ()
    first_token: int = 0  # token ids are drawn from [first_token, VOCAB)


def text(cls, config) -> Callable[[], torch.nn.Module]:
    return lambda: cls(config)


FAMILIES = [
    Family(
        "bert",
        text(
            tf.BertModel,
            tf.BertConfig(
                vocab_size=VOCAB,
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=2,
                intermediate_size=64,
                max_position_embeddings=256,
            ),
        ),
        "text",
        "last_hidden_state",
        "post-LN encoder: embeddings (word, position, token type), LayerNorm, GELU, padding mask",
    ),
    Family(
        "roberta",
        text(
            tf.RobertaModel,
            tf.RobertaConfig(
                vocab_size=VOCAB,
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=2,
                intermediate_size=64,
                max_position_embeddings=258,
            ),
        ),
        "text",
        "last_hidden_state",
        "BERT with position ids from a cumulative sum over non-padding tokens",
        first_token=3,
    ),
    Family(
        "distilbert",
        text(
            tf.DistilBertModel,
            tf.DistilBertConfig(
                vocab_size=VOCAB,
                dim=32,
                n_layers=2,
                n_heads=2,
                hidden_dim=64,
                max_position_embeddings=256,
            ),
        ),
        "text",
        "last_hidden_state",
        "encoder without token types",
    ),
    Family(
        "gpt2",
        text(
            tf.GPT2LMHeadModel,
            tf.GPT2Config(
                vocab_size=VOCAB,
                n_embd=32,
                n_layer=2,
                n_head=2,
                n_positions=256,
                bos_token_id=0,
                eos_token_id=0,
            ),
        ),
        "text",
        "logits",
        "pre-LN decoder, Conv1D (addmm) projections, causal mask, GELU (tanh), tied LM head",
    ),
    Family(
        "gpt-neox",
        text(
            tf.GPTNeoXForCausalLM,
            tf.GPTNeoXConfig(
                vocab_size=VOCAB,
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=2,
                intermediate_size=64,
                max_position_embeddings=256,
                rotary_pct=0.25,
            ),
        ),
        "text",
        "logits",
        "Pythia: parallel attention + MLP residual, partial rotary embedding (25%)",
    ),
    Family(
        "llama",
        text(
            tf.LlamaForCausalLM,
            tf.LlamaConfig(
                vocab_size=VOCAB,
                hidden_size=64,
                intermediate_size=128,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                max_position_embeddings=256,
            ),
        ),
        "text",
        "logits",
        "RMSNorm, RoPE, grouped-query attention (4 heads, 2 KV heads), SiLU-gated MLP",
    ),
    Family(
        "mistral",
        text(
            tf.MistralForCausalLM,
            tf.MistralConfig(
                vocab_size=VOCAB,
                hidden_size=64,
                intermediate_size=128,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                max_position_embeddings=256,
                sliding_window=48,
            ),
        ),
        "text",
        "logits",
        "LLaMA-like with a sliding-window causal mask (window 48, active at 64 and 128 tokens)",
    ),
    Family(
        "qwen2",
        text(
            tf.Qwen2ForCausalLM,
            tf.Qwen2Config(
                vocab_size=VOCAB,
                hidden_size=64,
                intermediate_size=128,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                max_position_embeddings=256,
            ),
        ),
        "text",
        "logits",
        "LLaMA-like with biased Q/K/V projections, GQA",
    ),
    Family(
        "t5-encoder",
        text(
            tf.T5EncoderModel,
            tf.T5Config(
                vocab_size=VOCAB,
                d_model=32,
                d_kv=16,
                d_ff=64,
                num_layers=2,
                num_heads=2,
                relative_attention_num_buckets=32,
                relative_attention_max_distance=128,
            ),
        ),
        "text",
        "last_hidden_state",
        "T5 RMSNorm, relative position buckets (log, min, where), ReLU MLP",
    ),
    Family(
        "whisper-encoder",
        lambda: tf.models.whisper.modeling_whisper.WhisperEncoder(
            tf.WhisperConfig(
                vocab_size=VOCAB,
                d_model=32,
                encoder_layers=2,
                decoder_layers=1,
                encoder_attention_heads=2,
                decoder_attention_heads=2,
                encoder_ffn_dim=64,
                decoder_ffn_dim=64,
                num_mel_bins=16,
                max_source_positions=32,
                max_target_positions=32,
                pad_token_id=0,
                bos_token_id=0,
                eos_token_id=0,
                decoder_start_token_id=0,
            )
        ),
        "audio",
        "last_hidden_state",
        "Conv1d stem (stride 2) + GELU, sinusoidal positions, pre-LN encoder",
        shape=(16, 64),
    ),
    Family(
        "bart",
        text(
            tf.BartModel,
            tf.BartConfig(
                vocab_size=VOCAB,
                d_model=32,
                encoder_layers=2,
                decoder_layers=2,
                encoder_attention_heads=2,
                decoder_attention_heads=2,
                encoder_ffn_dim=64,
                decoder_ffn_dim=64,
                max_position_embeddings=256,
            ),
        ),
        "text",
        "last_hidden_state",
        "encoder-decoder: decoder inputs shifted from the input ids, learned positions (offset "
        "2), causal self-attention, cross-attention over the padded encoder output",
        first_token=3,
    ),
    Family(
        "deberta-v2",
        text(
            tf.DebertaV2Model,
            tf.DebertaV2Config(
                vocab_size=VOCAB,
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=2,
                intermediate_size=64,
                max_position_embeddings=256,
                relative_attention=True,
                position_buckets=32,
                pos_att_type=["p2c", "c2p"],
            ),
        ),
        "text",
        "last_hidden_state",
        "disentangled attention: log-bucketed relative positions, content-to-position and "
        "position-to-content scores (GatherElements), position keys tiled over batch x heads",
    ),
    Family(
        "xlnet",
        text(
            tf.XLNetModel,
            tf.XLNetConfig(
                vocab_size=VOCAB, d_model=32, n_layer=2, n_head=2, d_inner=64
            ),
        ),
        "text",
        "last_hidden_state",
        "relative sinusoidal positions (Range(n, -n, -1)), EyeLike, Einsum attention with the "
        "relative shift",
    ),
    Family(
        "vit",
        lambda: tf.ViTForImageClassification(
            tf.ViTConfig(
                image_size=32,
                patch_size=8,
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=2,
                intermediate_size=64,
                num_labels=10,
            )
        ),
        "image",
        "logits",
        "patch embedding Conv2d, class token concat, pre-LN encoder, classifier on token 0",
        shape=(3, 32, 32),
    ),
    Family(
        "videomae",
        lambda: tf.VideoMAEForVideoClassification(
            tf.VideoMAEConfig(
                image_size=32,
                patch_size=8,
                num_frames=4,
                tubelet_size=2,
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=2,
                intermediate_size=64,
                num_labels=10,
            )
        ),
        "image",
        "logits",
        "video: tubelet embedding Conv3d (2 frames × 8 × 8), sinusoidal positions, mean-pooled "
        "encoder, classifier",
        shape=(4, 3, 32, 32),
    ),
    Family(
        "deit",
        lambda: tf.DeiTForImageClassification(
            tf.DeiTConfig(
                image_size=32,
                patch_size=8,
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=2,
                intermediate_size=64,
                num_labels=10,
            )
        ),
        "image",
        "logits",
        "ViT with class and distillation tokens",
        shape=(3, 32, 32),
    ),
    Family(
        "swin",
        lambda: tf.SwinForImageClassification(
            tf.SwinConfig(
                image_size=32,
                patch_size=2,
                embed_dim=16,
                depths=[2, 2],
                num_heads=[2, 4],
                window_size=4,
                num_labels=10,
            )
        ),
        "image",
        "logits",
        "windowed attention, shifted windows (roll + mask), relative position bias, patch merging",
        shape=(3, 32, 32),
    ),
    Family(
        "dinov2",
        lambda: tf.Dinov2Model(
            tf.Dinov2Config(
                image_size=32,
                patch_size=8,
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=2,
                mlp_ratio=2,
            )
        ),
        "image",
        "last_hidden_state",
        "ViT whose position grid is resized to the input (bicubic Resize, grid side "
        "Cast(Pow(n, 0.5))), layer scale",
        shape=(3, 32, 32),
    ),
    Family(
        "swinv2",
        lambda: tf.Swinv2ForImageClassification(
            tf.Swinv2Config(
                image_size=32,
                patch_size=2,
                embed_dim=16,
                depths=[1, 1],
                num_heads=[1, 2],
                window_size=4,
                num_labels=10,
            )
        ),
        "image",
        "logits",
        "cosine attention (ReduceL2, clamped logit scale), continuous position bias from an "
        "MLP over log-spaced coordinates, post-norm, shifted windows",
        shape=(3, 32, 32),
    ),
    Family(
        "segformer",
        lambda: tf.SegformerForSemanticSegmentation(
            tf.SegformerConfig(
                num_encoder_blocks=2,
                depths=[1, 1],
                sr_ratios=[2, 1],
                hidden_sizes=[16, 32],
                patch_sizes=[7, 3],
                strides=[4, 2],
                num_attention_heads=[1, 2],
                mlp_ratios=[2, 2],
                decoder_hidden_size=32,
                num_labels=5,
            )
        ),
        "image",
        "logits",
        "semantic segmentation: overlapping patch embeddings, attention over a spatially "
        "reduced (strided Conv) sequence, Mix-FFN depthwise conv, all-MLP decoder resizing "
        "every stage to one size (Resize sizes holding the symbolic batch)",
        shape=(3, 32, 32),
    ),
    Family(
        "mobilevit",
        lambda: tf.MobileViTForImageClassification(
            tf.MobileViTConfig(
                image_size=32,
                hidden_sizes=[16, 24, 32],
                neck_hidden_sizes=[8, 8, 16, 16, 24, 24, 48],
                num_attention_heads=2,
                num_labels=10,
                patch_size=2,
            )
        ),
        "image",
        "logits",
        "MobileNetV2 blocks with transformer blocks over unfolded 2x2 patches (Resize where a "
        "feature map is no multiple of the patch), SiLU",
        shape=(3, 32, 32),
    ),
    Family(
        "mobilenet-v2",
        lambda: tf.MobileNetV2ForImageClassification(
            tf.MobileNetV2Config(image_size=32, depth_multiplier=0.25, num_labels=10)
        ),
        "image",
        "logits",
        "depthwise separable convs, inverted residuals, ReLU6 (Clip), BatchNorm, TF padding",
        shape=(3, 32, 32),
    ),
    Family(
        "mobilenet-v3",
        lambda: __import__("torchvision").models.mobilenet_v3_small(
            width_mult=0.25, num_classes=10
        ),
        "image",
        None,
        "torchvision: hard-swish, hard-sigmoid squeeze-excitation, depthwise convs",
        shape=(3, 32, 32),
    ),
    Family(
        "efficientnet",
        lambda: tf.EfficientNetForImageClassification(
            tf.EfficientNetConfig(
                image_size=32,
                width_coefficient=0.25,
                depth_coefficient=0.25,
                hidden_dim=320,  # round_filters(1280) at width 0.25
                num_labels=10,
            )
        ),
        "image",
        "logits",
        "MBConv blocks, SiLU, squeeze-excitation (global pool, sigmoid gate), depthwise convs",
        shape=(3, 32, 32),
    ),
    Family(
        "convnext",
        lambda: tf.ConvNextForImageClassification(
            tf.ConvNextConfig(
                image_size=32,
                patch_size=4,
                num_stages=2,
                hidden_sizes=[16, 32],
                depths=[1, 1],
                num_labels=10,
            )
        ),
        "image",
        "logits",
        "7x7 depthwise convs, channels-last LayerNorm (permutes), GELU, layer scale",
        shape=(3, 32, 32),
    ),
    Family(
        "resnet",
        lambda: tf.ResNetForImageClassification(
            tf.ResNetConfig(
                embedding_size=16,
                hidden_sizes=[16, 32],
                depths=[1, 1],
                layer_type="bottleneck",
                num_labels=10,
            )
        ),
        "image",
        "logits",
        "conv + BatchNorm + ReLU, max pool, bottleneck residual blocks, global average pool",
        shape=(3, 32, 32),
    ),
    Family(
        "longt5",
        text(
            tf.LongT5Model,
            tf.LongT5Config(
                vocab_size=VOCAB,
                d_model=32,
                d_kv=16,
                d_ff=64,
                num_layers=2,
                num_decoder_layers=2,
                num_heads=2,
                local_radius=4,
                encoder_attention_type="local",
                eos_token_id=1,
                pad_token_id=0,
                decoder_start_token_id=0,
            ),
        ),
        "seq2seq",
        "last_hidden_state",
        "encoder-decoder (the tokens also feed the decoder); local attention over blocks: the "
        "sequence padded to whole blocks by a Pad of symbolic width",
    ),
    Family(
        "mixtral",
        text(
            tf.MixtralForCausalLM,
            tf.MixtralConfig(
                vocab_size=VOCAB,
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=2,
                num_key_value_heads=1,
                intermediate_size=64,
                max_position_embeddings=256,
                num_local_experts=4,
                num_experts_per_tok=2,
                # Every expert on every token: the default grouped matmul does not export.
                experts_implementation="batched_mm",
            ),
        ),
        "text",
        "logits",
        "mixture of experts: softmax router, TopK, OneHot-built Tile repeats, weighted sum of "
        "the experts' SiLU-gated MLPs; grouped-query attention, RoPE",
    ),
    Family(
        "fnet",
        text(
            tf.FNetModel,
            tf.FNetConfig(
                vocab_size=VOCAB,
                hidden_size=32,
                num_hidden_layers=2,
                intermediate_size=64,
                max_position_embeddings=256,
                use_tpu_fourier_optimizations=False,
            ),
        ),
        "text",
        "last_hidden_state",
        "Fourier mixing: a 2-D DFT over the symbolic sequence and the hidden axis (dynamo only: "
        "TorchScript cannot export fft_fftn)",
    ),
    Family(
        "mpt",
        text(
            tf.MptForCausalLM,
            tf.MptConfig(
                vocab_size=VOCAB,
                d_model=32,
                n_heads=2,
                n_layers=2,
                expansion_ratio=2,
                max_seq_len=256,
            ),
        ),
        "text",
        "logits",
        "ALiBi: a bias over the last `max(max_seq_len - n, 0)` positions (dynamo: a `Max` of "
        "symbolic dims, the slice's extent `T.min(n, 256)` broadcast against the scores)",
    ),
    Family(
        "mamba2",
        text(
            tf.Mamba2ForCausalLM,
            tf.Mamba2Config(
                vocab_size=VOCAB,
                hidden_size=32,
                num_hidden_layers=2,
                state_size=8,
                num_heads=4,
                head_dim=16,
                expand=2,
                n_groups=1,
                chunk_size=8,
            ),
        ),
        "text",
        "logits",
        "state-space model: causal Conv1d, chunked scan (CumSum, Einsum, Trilu masks); the "
        "sequence padded to whole chunks and viewed back unpadded, valid for the multiples of "
        "the chunk the inputs have (TorchScript's export fails in onnxruntime)",
    ),
]


def build(f: Family) -> Wrapper:
    """The model of family `f`, its weights drawn from the family's seed."""
    torch.manual_seed(0)
    wrapper = {
        "text": TextWrapper,
        "seq2seq": Seq2SeqWrapper,
        "image": ImageWrapper,
        "audio": AudioWrapper,
        "values": ValuesWrapper,
    }[f.kind]
    model = wrapper(f.build(), f.output).eval()
    calibrate_batch_norm(model, f)
    return model


def calibrate_batch_norm(model: Wrapper, f: Family) -> None:
    """Sets the running statistics of every BatchNorm to those of one seeded batch.

    With freshly initialised statistics (mean 0, variance 1) the activations of a deep random
    CNN shrink layer by layer until its logits are about 1e-30: a useless fixture. After one
    forward pass in training mode with a cumulative average (momentum None) each BatchNorm
    normalises its input to about unit variance, and the outputs are O(1). The scales and
    shifts are drawn too (in [0.5, 1.5] and [-0.2, 0.2]): some initialisers (EfficientNet's)
    draw the scales from N(0, 0.02), which shrinks every layer as much.
    """
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
    batch = make_inputs(f, 8, TRACE_SEQ, seed=2)
    with torch.no_grad():
        model(*(torch.from_numpy(batch[n]) for n in input_names(f)))
    model.eval()


def is_text(f: Family) -> bool:
    return f.kind in ("text", "seq2seq")


def input_names(f: Family) -> list[str]:
    return {
        "text": ["input_ids", "attention_mask"],
        "seq2seq": ["input_ids", "attention_mask"],
        "values": ["input_values"],
        "image": ["pixel_values"],
        "audio": ["input_features"],
    }[f.kind]


def output_name(f: Family) -> str:
    return f.output or "logits"


def make_inputs(f: Family, batch: int, seq: int, seed: int) -> dict[str, np.ndarray]:
    """Seeded inputs: token ids and a right-padding mask, or pixels / features in [-1, 1]."""
    rng = np.random.default_rng(seed)
    if is_text(f):
        ids = rng.integers(f.first_token, VOCAB, size=(batch, seq), dtype=np.int64)
        mask = np.ones((batch, seq), dtype=np.int64)
        if batch > 1:
            mask[1, seq - seq // 4 :] = 0
        return {"input_ids": ids, "attention_mask": mask}
    x = rng.uniform(-1.0, 1.0, size=(batch, *f.shape)).astype(np.float32)
    return {input_names(f)[0]: x}


def input_sets(f: Family) -> list[tuple[str, dict[str, np.ndarray]]]:
    if is_text(f):
        return [(name, make_inputs(f, b, s, seed=s)) for name, b, s in TEXT_SETS]
    return [("default", make_inputs(f, 2, 0, seed=0))]


def export(f: Family, exporter: str, model: Wrapper, path: Path) -> None:
    """Exports `model` to `path` with the TorchScript (`ts`) or the dynamo exporter."""
    example = make_inputs(f, TRACE_BATCH, TRACE_SEQ, seed=1)
    names = input_names(f)
    args = tuple(torch.from_numpy(example[n]) for n in names)
    out = output_name(f)
    text_model = is_text(f)
    if exporter in ("ts", "ts16"):
        axes = {n: {0: "batch", 1: "sequence"} if text_model else {0: "batch"} for n in names}
        axes[out] = {0: "batch", 1: "sequence"} if text_model else {0: "batch"}
        torch.onnx.export(
            model,
            args,
            str(path),
            dynamo=False,
            opset_version=16 if exporter == "ts16" else 17,
            input_names=names,
            output_names=[out],
            dynamic_axes=axes,
        )
    else:
        batch = torch.export.Dim("batch", min=1, max=64)
        seq = torch.export.Dim("sequence", min=2, max=128)
        dims = {0: batch, 1: seq} if text_model else {0: batch}
        program = torch.onnx.export(
            model,
            args,
            dynamo=True,
            opset_version=18,
            input_names=names,
            output_names=[out],
            dynamic_shapes={n: dims for n in names},
            external_data=False,
            verbose=False,
        )
        program.save(str(path), external_data=False)


def ort_run(path: Path, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    graph_inputs = [i.name for i in sess.get_inputs()]
    feed = {n: inputs[n] for n in graph_inputs}
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feed)))


def save_npy(path: Path, a: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path, np.ascontiguousarray(a), allow_pickle=False)


def describe(e: BaseException) -> str:
    """The innermost cause of an exception, on one line without terminal colours."""
    while e.__cause__ is not None:
        e = e.__cause__
    msg = re.sub(r"\x1b\[[0-9;]*m", "", f"{type(e).__name__}: {e}")
    return " ".join(msg.split())[:300]


def write_fixture(f: Family, exporter: str, model: Wrapper) -> str:
    """Exports, checks against torch and writes one fixture; returns its summary line."""
    d = OUT / f"{f.name}-{exporter}"
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    path = d / "model.onnx"
    note = ""
    try:
        try:
            export(f, exporter, model, path)
        except Exception as e:  # noqa: BLE001 - retried with eager attention below
            config = getattr(model.model, "config", None)
            original = getattr(config, "_attn_implementation", "eager")
            if original == "eager":
                raise
            # The dynamo exporter fails on some models' SDPA attention with dynamic shapes
            # (a view of a transposed tensor); their eager attention exports.
            note = f" (attn_implementation=eager: with sdpa: {describe(e)[:200]})"
            config._attn_implementation = "eager"
            try:
                export(f, exporter, model, path)
            finally:
                config._attn_implementation = original
        proto = onnx.load(str(path))
        ops = sorted({n.op_type for n in proto.graph.node})
        graph_inputs = [i.name for i in proto.graph.input]
        worst, lo, hi = 0.0, float("inf"), float("-inf")
        for set_name, inputs in input_sets(f):
            outs = ort_run(path, inputs)
            with torch.no_grad():
                want = model(*(torch.from_numpy(inputs[n]) for n in input_names(f))).numpy()
            got = next(iter(outs.values()))
            err = float(np.abs(got - want).max())
            scale = float(want.max() - want.min()) or 1.0
            if not err <= 1e-4 * scale:  # NaN fails too
                raise RuntimeError(f"{set_name}: onnxruntime differs from torch by {err:.3g}")
            worst = max(worst, err)
            lo, hi = min(lo, float(want.min())), max(hi, float(want.max()))
            for n in graph_inputs:
                save_npy(d / set_name / "inputs" / f"{n}.npy", inputs[n])
            for n, a in outs.items():
                save_npy(d / set_name / "outputs" / f"{n}.npy", a)
    except Exception as e:  # noqa: BLE001 - any exporter failure is recorded, not fatal
        shutil.rmtree(d)
        if os.environ.get("VERBOSE"):
            traceback.print_exc()
        return f"{f.name}-{exporter}: FAILED {describe(e)}"
    size = sum(p.stat().st_size for p in d.rglob("*") if p.is_file())
    return (
        f"{f.name}-{exporter}: ok{note}, {size / 1024:.0f} KiB, {len(proto.graph.node)} nodes, "
        f"outputs in [{lo:.3g}, {hi:.3g}], torch vs onnxruntime max err {worst:.2g}; ops: {' '.join(ops)}"
    )


# Families also exported at opset 16 (`ts16`), for the decomposed LayerNorm.
OPSET16 = {"bert"}


def exporters(f: Family) -> tuple[str, ...]:
    return ("ts", "dynamo", "ts16") if f.name in OPSET16 else ("ts", "dynamo")


def main() -> None:
    # `family` or `family:exporter`.
    picks = [a.split(":", 1) for a in sys.argv[1:]]
    wanted = {p[0] for p in picks}
    only = {p[0]: p[1] for p in picks if len(p) == 2}
    known = {f.name for f in FAMILIES}
    if wanted - known:
        sys.exit(f"unknown families: {sorted(wanted - known)}; known: {sorted(known)}")
    OUT.mkdir(parents=True, exist_ok=True)
    report = OUT / "exports.txt"
    lines = {}
    if report.exists():
        for line in report.read_text().splitlines():
            if line and not line.startswith("#"):
                lines[line.split(":", 1)[0]] = line
    for f in FAMILIES:
        if wanted and f.name not in wanted:
            continue
        try:
            model = build(f)
        except Exception as e:  # noqa: BLE001 - recorded, not fatal
            model, error = None, describe(e)
        for exporter in exporters(f):
            if f.name in only and only[f.name] != exporter:
                continue
            if model is None:
                shutil.rmtree(OUT / f"{f.name}-{exporter}", ignore_errors=True)
                line = f"{f.name}-{exporter}: FAILED building the model: {error}"
            else:
                line = write_fixture(f, exporter, model)
            print(line, flush=True)
            lines[f"{f.name}-{exporter}"] = line
    order = [f"{f.name}-{e}" for f in FAMILIES for e in exporters(f)]
    header = (
        f"# written by scripts/export_hf_models.py (torch {torch.__version__}, transformers "
        f"{tf.__version__}, onnx {onnx.__version__}, onnxruntime {ort.__version__})\n"
    )
    body = "".join(lines[k] + "\n" for k in order if k in lines)
    report.write_text(header + body)


if __name__ == "__main__":
    main()
