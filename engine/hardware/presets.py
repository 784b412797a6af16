"""Model shapes for the fit and roofline estimate: the published Qwen3-MoE configs (`--preset`), and parameter counts
of any ModelConfig.

The presets are the published config.json values of the two checkpoints (every layer MoE, no shared experts), read by
the same ModelConfig as a model file's. Sizes are computed from the config, not looked up.
"""

from __future__ import annotations

from engine.config import HF_ARCHITECTURE, ModelConfig
from engine.errors import TesseraError

# Bytes per stored weight by format. q8_0: blocks of 32 int8 + one f16 scale. int8: the int8 backends' packing
# (per-output-channel f32 scales: negligible next to the weights).
BYTES_PER_WEIGHT = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "int8": 1.0}


def _published(name: str, **sizes: int) -> ModelConfig:
    common = {"architectures": [HF_ARCHITECTURE], "num_key_value_heads": 4, "head_dim": 128,
              "num_experts": 128, "num_experts_per_tok": 8, "norm_topk_prob": True, "vocab_size": 151936,
              "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "max_position_embeddings": 40960,
              "bos_token_id": 151643, "eos_token_id": 151645}  # fmt: skip
    return ModelConfig.from_hf_dict({**common, **sizes}, name)


PRESETS: dict[str, ModelConfig] = {
    "qwen3-30b-a3b": _published("Qwen3-30B-A3B", hidden_size=2048, num_hidden_layers=48, num_attention_heads=32,
                                moe_intermediate_size=768, intermediate_size=6144),
    "qwen3-235b-a22b": _published("Qwen3-235B-A22B", hidden_size=4096, num_hidden_layers=94, num_attention_heads=64,
                                  moe_intermediate_size=1536, intermediate_size=12288),
}  # fmt: skip


def preset(name: str) -> ModelConfig:
    """The published config of a preset; its `source` is the model's name."""
    key = name.lower()
    if key not in PRESETS:
        raise TesseraError("--preset", f"unknown preset {name!r}; known: {', '.join(PRESETS)}")
    return PRESETS[key]


def expert_params(cfg: ModelConfig) -> int:
    """All routed-expert weights: L_moe * E * 3 * H * I."""
    return len(cfg.moe_layers) * cfg.num_experts * 3 * cfg.hidden_size * cfg.moe_intermediate_size


def active_expert_params(cfg: ModelConfig) -> int:
    """Routed-expert weights read per decoded token: L_moe * k * 3 * H * I."""
    return len(cfg.moe_layers) * cfg.num_experts_per_tok * 3 * cfg.hidden_size * cfg.moe_intermediate_size


def dense_params(cfg: ModelConfig) -> int:
    """Everything that is not a routed expert: embeddings, attention, norms, routers, dense MLPs, lm_head."""
    h, hd = cfg.hidden_size, cfg.head_dim
    attn = h * cfg.num_attention_heads * hd * 2 + h * cfg.num_key_value_heads * hd * 2  # q,o + k,v
    per_layer = attn + 2 * h + 2 * hd  # + input/post-attention norms + q/k norms
    router = len(cfg.moe_layers) * cfg.num_experts * h
    dense_mlp = len(cfg.dense_layers) * 3 * h * cfg.intermediate_size
    embed = cfg.vocab_size * h * (1 if cfg.tie_word_embeddings else 2)
    return cfg.num_hidden_layers * per_layer + router + dense_mlp + embed + h
