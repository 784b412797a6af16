"""Model shapes for the fit and roofline estimate: the published Qwen3-MoE configs (`--preset`,
engine.config.PUBLISHED), and parameter counts of any ModelConfig, computed from the config, not looked up.
"""

from __future__ import annotations

from tessera.engine.config import PUBLISHED, ModelConfig
from tessera.engine.errors import TesseraError

# Bytes per stored weight by format. q8_0: blocks of 32 int8 + one f16 scale. int8: the int8 backends' packing
# (per-output-channel f32 scales: negligible next to the weights).
BYTES_PER_WEIGHT = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "int8": 1.0}


def preset(name: str) -> ModelConfig:
    """The published config of a preset; its `source` is the model's name."""
    key = name.lower()
    if key not in PUBLISHED:
        raise TesseraError("--preset", f"unknown preset {name!r}; known: {', '.join(PUBLISHED)}")
    return PUBLISHED[key]


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
