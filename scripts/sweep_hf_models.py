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


def configured(name, cls, config_cls, kind, output, defaults, kw, **extra):
    """A family built from `defaults` overridden (or dropped with None) by `kw`."""
    cfg = {**defaults, **kw}
    cfg = {k: v for k, v in cfg.items() if v is not None}
    return Family(name, lambda: cls(config_cls(**cfg)), kind, output, name, **extra)


def text(name, cls, config_cls, output="last_hidden_state", **kw):
    """A text family: BERT-sized defaults, overridden (or dropped with None) by `kw`."""
    defaults = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
    )
    return configured(name, cls, config_cls, "text", output, defaults, kw)


def seq2seq(name, cls, config_cls, output="last_hidden_state", **kw):
    """An encoder-decoder family: the tokens feed both sides (decoder_input_ids = input_ids)."""
    defaults = dict(
        vocab_size=VOCAB,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=256,
        pad_token_id=0,
        bos_token_id=0,
        eos_token_id=2,
        decoder_start_token_id=0,
    )
    return configured(name, cls, config_cls, "seq2seq", output, defaults, kw)


def t5like(name, cls, config_cls, **kw):
    """A T5-shaped encoder-decoder (d_kv, num_layers, relative position buckets)."""
    cfg = dict(
        d_model=32, d_kv=16, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=2,
        encoder_layers=None, decoder_layers=None, encoder_attention_heads=None,
        decoder_attention_heads=None, encoder_ffn_dim=None, decoder_ffn_dim=None,
        max_position_embeddings=None, bos_token_id=None, eos_token_id=1,
    )
    cfg.update(kw)
    return seq2seq(name, cls, config_cls, **cfg)


def values(name, build, shape, output="last_hidden_state"):
    """A family fed `input_values`: raw waveforms (samples,) or spectrograms (frames, bins)."""
    return Family(name, build, "values", output, name, shape=shape)


def wave(name, cls, config_cls, **kw):
    """A wav2vec2-shaped speech encoder over 800 samples of raw audio (two conv layers, stride 10)."""
    defaults = dict(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=8,
        num_conv_pos_embedding_groups=4, vocab_size=VOCAB,
    )
    return configured(name, cls, config_cls, "values", "last_hidden_state", defaults, kw,
                      shape=(800,))


def image(name, build, output="logits", shape=(3, 32, 32)):
    return Family(name, build, "image", output, name, shape=shape)


def vit(name, cls, config_cls, output="logits", **kw):
    """A ViT-shaped image family over 32 x 32 pixels in 8 x 8 patches."""
    defaults = dict(
        image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64,
    )
    return configured(name, cls, config_cls, "image", output, defaults, kw, shape=(3, 32, 32))


def lm(name, cls, config_cls, **kw):
    """A decoder-only language model returning logits (grouped-query heads where it has them)."""
    kw.setdefault("max_position_embeddings", 256)
    return text(name, cls, config_cls, "logits", **kw)


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
    # Round two.
    text("roformer", tf.RoFormerModel, tf.RoFormerConfig, embedding_size=32,
         max_position_embeddings=256),
    text("ernie", tf.ErnieModel, tf.ErnieConfig, max_position_embeddings=256),
    text("squeezebert", tf.SqueezeBertModel, tf.SqueezeBertConfig, embedding_size=32,
         max_position_embeddings=256, q_groups=2, k_groups=2, v_groups=2, post_attention_groups=2,
         intermediate_groups=2, output_groups=2),
    text("megatron-bert", tf.MegatronBertModel, tf.MegatronBertConfig,
         max_position_embeddings=256),
    text("fnet", tf.FNetModel, tf.FNetConfig, max_position_embeddings=256, num_attention_heads=None,
         use_tpu_fourier_optimizations=False),
    text("bigbird", tf.BigBirdModel, tf.BigBirdConfig, max_position_embeddings=256,
         attention_type="original_full"),
    text("nystromformer", tf.NystromformerModel, tf.NystromformerConfig,
         max_position_embeddings=260, num_landmarks=4, segment_means_seq_len=128),
    text("data2vec-text", tf.Data2VecTextModel, tf.Data2VecTextConfig,
         max_position_embeddings=260, pad_token_id=1),
    text("layoutlm", tf.LayoutLMModel, tf.LayoutLMConfig, max_position_embeddings=256),
    text("rembert", tf.RemBertModel, tf.RemBertConfig, input_embedding_size=16,
         output_embedding_size=16, max_position_embeddings=256, pad_token_id=0, bos_token_id=1,
         eos_token_id=2),
    text("esm", tf.EsmModel, tf.EsmConfig, max_position_embeddings=260, pad_token_id=1,
         position_embedding_type="rotary", token_dropout=False),
    text("longformer", tf.LongformerModel, tf.LongformerConfig, max_position_embeddings=260,
         attention_window=8, pad_token_id=1),
    seq2seq("pegasus", tf.PegasusModel, tf.PegasusConfig),
    seq2seq("marian", tf.MarianModel, tf.MarianConfig, decoder_start_token_id=0),
    seq2seq("mbart", tf.MBartModel, tf.MBartConfig),
    seq2seq("m2m100", tf.M2M100Model, tf.M2M100Config),
    seq2seq("blenderbot", tf.BlenderbotModel, tf.BlenderbotConfig),
    seq2seq("blenderbot-small", tf.BlenderbotSmallModel, tf.BlenderbotSmallConfig),
    seq2seq("plbart", tf.PLBartModel, tf.PLBartConfig),
    seq2seq("led", tf.LEDModel, tf.LEDConfig, max_encoder_position_embeddings=256,
             max_decoder_position_embeddings=256, max_position_embeddings=None,
             attention_window=8),
    t5like("t5", tf.T5Model, tf.T5Config),
    t5like("mt5", tf.MT5Model, tf.MT5Config),
    t5like("umt5", tf.UMT5Model, tf.UMT5Config),
    t5like("longt5", tf.LongT5Model, tf.LongT5Config, local_radius=4,
           encoder_attention_type="local"),
    t5like("switch-transformers", tf.SwitchTransformersModel, tf.SwitchTransformersConfig,
           num_experts=4, expert_capacity=64, num_sparse_encoder_layers=1,
           num_sparse_decoder_layers=1),
    lm("gpt-neo", tf.GPTNeoForCausalLM, tf.GPTNeoConfig, num_layers=2,
       attention_types=[[["global", "local"], 1]], window_size=8, num_hidden_layers=None),
    lm("xglm", tf.XGLMForCausalLM, tf.XGLMConfig, d_model=32, num_layers=2, attention_heads=2,
       ffn_dim=64, hidden_size=None, num_hidden_layers=None, num_attention_heads=None,
       intermediate_size=None, pad_token_id=1),
    lm("biogpt", tf.BioGptForCausalLM, tf.BioGptConfig, pad_token_id=1),
    # MoE layers run every expert on every token (`batched_mm`): the default grouped matmul
    # (histc, grouped_mm) does not export.
    lm("mixtral", tf.MixtralForCausalLM, tf.MixtralConfig, num_key_value_heads=1,
       num_local_experts=4, num_experts_per_tok=2,
       experts_implementation="batched_mm"),
    lm("qwen2-moe", tf.Qwen2MoeForCausalLM, tf.Qwen2MoeConfig, num_key_value_heads=1,
       num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
       shared_expert_intermediate_size=32,
       experts_implementation="batched_mm"),
    lm("qwen3", tf.Qwen3ForCausalLM, tf.Qwen3Config, num_key_value_heads=1, head_dim=16),
    lm("qwen3-moe", tf.Qwen3MoeForCausalLM, tf.Qwen3MoeConfig, num_key_value_heads=1,
       head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
       experts_implementation="batched_mm"),
    lm("olmo", tf.OlmoForCausalLM, tf.OlmoConfig, pad_token_id=1),
    lm("olmo2", tf.Olmo2ForCausalLM, tf.Olmo2Config, pad_token_id=1),
    lm("olmoe", tf.OlmoeForCausalLM, tf.OlmoeConfig, pad_token_id=1, num_experts=4,
       num_experts_per_tok=2,
       experts_implementation="batched_mm"),
    lm("cohere", tf.CohereForCausalLM, tf.CohereConfig, num_key_value_heads=1, pad_token_id=0,
       bos_token_id=1, eos_token_id=2),
    lm("starcoder2", tf.Starcoder2ForCausalLM, tf.Starcoder2Config, num_key_value_heads=1),
    lm("persimmon", tf.PersimmonForCausalLM, tf.PersimmonConfig),
    lm("mpt", tf.MptForCausalLM, tf.MptConfig, d_model=32, n_heads=2, n_layers=2,
       expansion_ratio=2, max_seq_len=256, hidden_size=None, num_hidden_layers=None,
       num_attention_heads=None, intermediate_size=None, max_position_embeddings=None),
    lm("gpt-bigcode", tf.GPTBigCodeForCausalLM, tf.GPTBigCodeConfig, n_embd=32, n_layer=2,
       n_head=2, n_positions=256, multi_query=True, hidden_size=None, num_hidden_layers=None,
       num_attention_heads=None, intermediate_size=None, max_position_embeddings=None),
    lm("granite", tf.GraniteForCausalLM, tf.GraniteConfig, num_key_value_heads=1),
    lm("nemotron", tf.NemotronForCausalLM, tf.NemotronConfig, num_key_value_heads=1, head_dim=16,
       pad_token_id=0, bos_token_id=1, eos_token_id=2),
    lm("gemma3", tf.Gemma3ForCausalLM, tf.Gemma3TextConfig, num_key_value_heads=1, head_dim=16,
       sliding_window=8),
    lm("glm", tf.GlmForCausalLM, tf.GlmConfig, num_key_value_heads=1, head_dim=16,
       pad_token_id=0, eos_token_id=2),
    lm("glm4", tf.Glm4ForCausalLM, tf.Glm4Config, num_key_value_heads=1, head_dim=16,
       pad_token_id=0, eos_token_id=2),
    lm("helium", tf.HeliumForCausalLM, tf.HeliumConfig, num_key_value_heads=1, head_dim=16,
       pad_token_id=0, bos_token_id=1, eos_token_id=2),
    lm("smollm3", tf.SmolLM3ForCausalLM, tf.SmolLM3Config, num_key_value_heads=1,
       pad_token_id=0, bos_token_id=1, eos_token_id=2),
    lm("deepseek-v3", tf.DeepseekV3ForCausalLM, tf.DeepseekV3Config, num_key_value_heads=2,
       n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1, moe_intermediate_size=32,
       first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8,
       qk_nope_head_dim=8, v_head_dim=16, pad_token_id=0, bos_token_id=1, eos_token_id=2,
       experts_implementation="batched_mm"),
    lm("recurrent-gemma", tf.RecurrentGemmaForCausalLM, tf.RecurrentGemmaConfig,
       num_key_value_heads=1, lru_width=32, attention_window_size=8,
       block_types=["recurrent", "attention"], max_position_embeddings=None),
    lm("mamba2", tf.Mamba2ForCausalLM, tf.Mamba2Config, state_size=8, num_heads=4, head_dim=16,
       expand=2, n_groups=1, chunk_size=8, num_attention_heads=None, intermediate_size=None,
       max_position_embeddings=None),
    lm("rwkv", tf.RwkvForCausalLM, tf.RwkvConfig, context_length=256, attention_hidden_size=32,
       num_attention_heads=None, intermediate_size=64, max_position_embeddings=None),
    wave("wav2vec2", tf.Wav2Vec2Model, tf.Wav2Vec2Config),
    wave("hubert", tf.HubertModel, tf.HubertConfig),
    wave("wavlm", tf.WavLMModel, tf.WavLMConfig, num_buckets=32, max_bucket_distance=64),
    wave("sew", tf.SEWModel, tf.SEWConfig, squeeze_factor=2),
    wave("sew-d", tf.SEWDModel, tf.SEWDConfig, squeeze_factor=2, max_position_embeddings=64,
         position_buckets=32),
    wave("unispeech", tf.UniSpeechModel, tf.UniSpeechConfig),
    wave("data2vec-audio", tf.Data2VecAudioModel, tf.Data2VecAudioConfig, conv_pos_kernel_size=5,
         num_conv_pos_embeddings=2),
    wave("wav2vec2-conformer", tf.Wav2Vec2ConformerModel, tf.Wav2Vec2ConformerConfig,
         position_embeddings_type="rotary", conv_depthwise_kernel_size=3),
    values("ast", lambda: tf.ASTForAudioClassification(tf.ASTConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        patch_size=8, frequency_stride=8, time_stride=8, max_length=32, num_mel_bins=16,
        num_labels=5)), (32, 16), "logits"),
    Family("speech2text", lambda: tf.Speech2TextModel(tf.Speech2TextConfig(
        vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=1,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
        decoder_ffn_dim=64, input_feat_per_channel=16, conv_channels=32,
        max_source_positions=64)).get_encoder(), "audio", "last_hidden_state", "speech2text",
        shape=(64, 16)),
    vit("vit-msn", tf.ViTMSNForImageClassification, tf.ViTMSNConfig, num_labels=10),
    vit("data2vec-vision", tf.Data2VecVisionForImageClassification, tf.Data2VecVisionConfig,
        num_labels=10, use_relative_position_bias=True),
    vit("dinov2-registers", tf.Dinov2WithRegistersModel, tf.Dinov2WithRegistersConfig,
        "last_hidden_state", num_register_tokens=2),
    vit("ijepa", tf.IJepaModel, tf.IJepaConfig, "last_hidden_state"),
    vit("vitdet", tf.VitDetModel, tf.VitDetConfig, "last_hidden_state",
        pretrain_image_size=32, window_size=2, window_block_indices=[0],
        use_relative_position_embeddings=True),
    vit("owlvit-vision", tf.OwlViTVisionModel, tf.OwlViTVisionConfig, "last_hidden_state"),
    vit("groupvit-vision", tf.GroupViTVisionModel, tf.GroupViTVisionConfig, "last_hidden_state",
        depths=[1, 1, 1], num_group_tokens=[8, 4, 0], num_output_groups=[8, 4, 4],
        num_hidden_layers=None),
    vit("blip-vision", tf.BlipVisionModel, tf.BlipVisionConfig, "last_hidden_state"),
    vit("chinese-clip-vision", tf.ChineseCLIPVisionModel, tf.ChineseCLIPVisionConfig,
        "last_hidden_state"),
    image("bit", lambda: tf.BitForImageClassification(tf.BitConfig(
        embedding_size=8, hidden_sizes=[8, 16, 24, 32], depths=[1, 1, 1, 1], num_groups=4,
        num_labels=10))),
    image("cvt", lambda: tf.CvtForImageClassification(tf.CvtConfig(
        embed_dim=[16, 32, 48], num_heads=[1, 2, 2], depth=[1, 2, 3], num_labels=10))),
    image("pvt-v2", lambda: tf.PvtV2ForImageClassification(tf.PvtV2Config(
        hidden_sizes=[8, 16, 24, 32], num_attention_heads=[1, 1, 2, 2], depths=[1, 1, 1, 1],
        num_labels=10))),
    image("swiftformer", lambda: tf.SwiftFormerForImageClassification(tf.SwiftFormerConfig(
        embed_dims=[8, 16, 24, 32], depths=[1, 1, 1, 1], num_labels=10))),
    image("mobilenet-v1", lambda: tf.MobileNetV1ForImageClassification(tf.MobileNetV1Config(
        depth_multiplier=0.25, image_size=32, num_labels=10))),
    image("mobilevitv2", lambda: tf.MobileViTV2ForImageClassification(tf.MobileViTV2Config(
        image_size=64, width_multiplier=0.5, num_labels=10)), shape=(3, 64, 64)),
    image("glpn", lambda: tf.GLPNForDepthEstimation(tf.GLPNConfig(
        hidden_sizes=[8, 16, 24, 32], num_attention_heads=[1, 1, 2, 2], depths=[1, 1, 1, 1],
        decoder_hidden_size=16)), "predicted_depth"),
    image("hiera", lambda: tf.HieraForImageClassification(tf.HieraConfig(
        embed_dim=16, image_size=[32, 32], patch_size=[3, 3], patch_stride=[2, 2],
        patch_padding=[1, 1], depths=[1, 1, 1, 1], num_heads=[1, 1, 2, 2], num_labels=10,
        query_stride=[2, 2], masked_unit_size=[8, 8]))),
    image("textnet", lambda: tf.TextNetForImageClassification(tf.TextNetConfig(num_labels=10))),
    image("depth-anything", lambda: tf.DepthAnythingForDepthEstimation(tf.DepthAnythingConfig(
        backbone_config=tf.Dinov2Config(image_size=28, patch_size=14, hidden_size=32,
                                        num_hidden_layers=4, num_attention_heads=2,
                                        intermediate_size=64,
                                        out_features=["stage1", "stage2", "stage3", "stage4"],
                                        reshape_hidden_states=False),
        neck_hidden_sizes=[8, 16, 24, 32], fusion_hidden_size=16, head_hidden_size=8,
        reassemble_hidden_size=32, patch_size=14)), "predicted_depth", shape=(3, 28, 28)),
    image("upernet", lambda: tf.UperNetForSemanticSegmentation(tf.UperNetConfig(
        backbone_config=tf.ConvNextConfig(hidden_sizes=[8, 16, 24, 32], depths=[1, 1, 1, 1],
                                          out_features=["stage1", "stage2", "stage3", "stage4"]),
        hidden_size=16, auxiliary_in_channels=24, num_labels=5))),
    image("detr", lambda: tf.DetrForObjectDetection(tf.DetrConfig(
        use_timm_backbone=False, use_pretrained_backbone=False,
        backbone_config=tf.ResNetConfig(embedding_size=8, hidden_sizes=[8, 16, 24, 32],
                                        depths=[1, 1, 1, 1], out_features=["stage4"]),
        d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, num_queries=8,
        num_labels=5)), "logits", shape=(3, 64, 64)),
    image("timesformer", lambda: tf.TimesformerForVideoClassification(tf.TimesformerConfig(
        image_size=32, patch_size=8, num_frames=4, hidden_size=32, num_hidden_layers=2,
        num_attention_heads=2, intermediate_size=64, num_labels=10)), "logits",
        shape=(4, 3, 32, 32)),
    image("sam-vision", lambda: tf.SamVisionModel(tf.SamVisionConfig(
        image_size=32, patch_size=8, hidden_size=32, output_channels=16, num_hidden_layers=2,
        num_attention_heads=2, mlp_dim=64, window_size=2, global_attn_indexes=[1],
        num_pos_feats=8)), "last_hidden_state"),
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
