"""Model shapes for the fit and roofline estimate: the published Qwen3-MoE configs, and sizes computed from them.

Values are the published config.json fields (hidden_size, layers, heads, experts, ...) of the two checkpoints; every layer
is MoE and there are no shared experts. Sizes are computed, not looked up, so the same code serves a model file's config.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.errors import TesseraError

# Bytes per stored weight by format. q8_0: blocks of 32 int8 + one f16 scale. int8: the int8 backends' packing
# (per-output-channel f32 scales: negligible next to the weights).
BYTES_PER_WEIGHT = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "int8": 1.0}


@dataclass(frozen=True)
class MoeShape:
    name: str
    hidden_size: int  # H
    num_hidden_layers: int  # L
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    moe_intermediate_size: int  # I
    num_experts: int  # E
    num_experts_per_tok: int  # k
    vocab_size: int  # V
    tie_word_embeddings: bool = False
    dense_layers: int = 0  # layers with a dense MLP instead of experts
    intermediate_size: int = 0  # the dense MLP's width

    @property
    def moe_layers(self) -> int:
        return self.num_hidden_layers - self.dense_layers

    def expert_params(self) -> int:
        """All routed-expert weights: L_moe * E * 3 * H * I."""
        return self.moe_layers * self.num_experts * 3 * self.hidden_size * self.moe_intermediate_size

    def active_expert_params(self) -> int:
        """Routed-expert weights read per decoded token: L_moe * k * 3 * H * I."""
        return self.moe_layers * self.num_experts_per_tok * 3 * self.hidden_size * self.moe_intermediate_size

    def dense_params(self) -> int:
        """Everything that is not a routed expert: embeddings, attention, norms, routers, dense MLPs, lm_head."""
        h, hd = self.hidden_size, self.head_dim
        attn = h * self.num_attention_heads * hd * 2 + h * self.num_key_value_heads * hd * 2  # q,o + k,v
        per_layer = attn + 2 * h + 2 * hd  # + input/post-attention norms + q/k norms
        router = self.moe_layers * self.num_experts * h
        dense_mlp = self.dense_layers * 3 * h * self.intermediate_size
        embed = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return self.num_hidden_layers * per_layer + router + dense_mlp + embed + h


PRESETS: dict[str, MoeShape] = {
    "qwen3-30b-a3b": MoeShape("Qwen3-30B-A3B", hidden_size=2048, num_hidden_layers=48, num_attention_heads=32,
                              num_key_value_heads=4, head_dim=128, moe_intermediate_size=768, num_experts=128,
                              num_experts_per_tok=8, vocab_size=151936),
    "qwen3-235b-a22b": MoeShape("Qwen3-235B-A22B", hidden_size=4096, num_hidden_layers=94, num_attention_heads=64,
                                num_key_value_heads=4, head_dim=128, moe_intermediate_size=1536, num_experts=128,
                                num_experts_per_tok=8, vocab_size=151936),
}


def preset(name: str) -> MoeShape:
    key = name.lower()
    if key not in PRESETS:
        raise TesseraError("--preset", f"unknown preset {name!r}; known: {', '.join(PRESETS)}")
    return PRESETS[key]


def shape_from_hf_config(cfg: dict, name: str) -> MoeShape:
    """A MoeShape from a Hugging Face Qwen3-MoE config.json dict (missing keys raise TesseraError naming the key)."""
    try:
        layers = int(cfg["num_hidden_layers"])
        step = int(cfg.get("decoder_sparse_step", 1)) or 1
        mlp_only = set(cfg.get("mlp_only_layers", []))
        dense = sum(1 for i in range(layers) if i in mlp_only or (i + 1) % step != 0)
        return MoeShape(
            name, hidden_size=int(cfg["hidden_size"]), num_hidden_layers=layers,
            num_attention_heads=int(cfg["num_attention_heads"]),
            num_key_value_heads=int(cfg.get("num_key_value_heads", cfg["num_attention_heads"])),
            head_dim=int(cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]),
            moe_intermediate_size=int(cfg["moe_intermediate_size"]), num_experts=int(cfg["num_experts"]),
            num_experts_per_tok=int(cfg["num_experts_per_tok"]), vocab_size=int(cfg["vocab_size"]),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)), dense_layers=dense,
            intermediate_size=int(cfg.get("intermediate_size", 0)))
    except KeyError as e:
        raise TesseraError(f"{name}: key {e.args[0]}", "missing from config.json, needed for the size estimate") from e
