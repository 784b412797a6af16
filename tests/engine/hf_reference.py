"""Tiny random Qwen3-MoE models built with transformers (the test oracle), and their weights in Tessera's canonical
form."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

BASE = dict(
    vocab_size=151,
    hidden_size=40,
    intermediate_size=56,
    moe_intermediate_size=24,
    num_hidden_layers=3,
    num_attention_heads=5,
    num_key_value_heads=1,
    head_dim=8,
    num_experts=7,
    num_experts_per_tok=3,
    max_position_embeddings=512,
    rope_theta=10000.0,
    rms_norm_eps=1e-6,
)

# Several shapes of the architecture: non-power-of-two sizes, dense layers, norm_topk_prob off, head_dim != H/nh, tied,
# a head dim of 32.
CONFIGS = {
    "odd_sizes": dict(BASE),
    "dense_layers": dict(BASE, num_hidden_layers=4, mlp_only_layers=[0], decoder_sparse_step=2),
    "no_norm_topk": dict(BASE, norm_topk_prob=False, num_key_value_heads=5),
    "head_dim_wide": dict(BASE, hidden_size=36, num_attention_heads=4, num_key_value_heads=2, head_dim=14),
    "tied": dict(BASE, tie_word_embeddings=True, num_experts=9, num_experts_per_tok=1),
    # A head dim the native attention kernel takes (a multiple of 32): with a bf16 cache, decode steps run each layer
    # in one native call (engine.decode_layer), so the oracle tests hold that path to transformers too.
    "head_dim_32": dict(BASE, hidden_size=48, num_attention_heads=4, num_key_value_heads=2, head_dim=32),
}


def hf_model(overrides: dict, seed: int = 0):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(seed)
    cfg = dict(overrides)
    cfg.setdefault("norm_topk_prob", True)
    theta = cfg.pop("rope_theta")
    hf_cfg = Qwen3MoeConfig(**cfg, rope_parameters={"rope_type": "default", "rope_theta": theta})
    hf_cfg._attn_implementation = "eager"
    model = Qwen3MoeForCausalLM(hf_cfg).eval()
    with torch.no_grad():  # larger-than-init weights and non-trivial norms, so mistakes show in the logits
        for p in model.parameters():
            if p.ndim == 1:
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) * (0.6 / p.shape[-1] ** 0.5))
    return model


def model_config(hf_cfg):
    """The engine's ModelConfig for a transformers config."""
    try:
        from tessera.engine.config import ModelConfig
    except ImportError:
        ModelConfig = None
    d = hf_cfg.to_dict()
    if ModelConfig is not None:
        return ModelConfig.from_hf_dict(d, "test config")
    rope_theta = d["rope_parameters"]["rope_theta"]
    ns = SimpleNamespace(**{k: d[k] for k in BASE if k != "rope_theta"}, rope_theta=rope_theta)
    ns.norm_topk_prob = d["norm_topk_prob"]
    ns.tie_word_embeddings = d["tie_word_embeddings"]
    mlp_only, step, n_exp = d["mlp_only_layers"], d["decoder_sparse_step"], d["num_experts"]
    ns.is_moe_layer = lambda i: i not in mlp_only and n_exp > 0 and (i + 1) % step == 0
    return ns


def canonical_weights(model):
    """ModelWeights-shaped object (config + canonical tensors) from a transformers model's state dict."""
    tensors = {}
    for name, t in model.state_dict().items():
        if name.endswith("mlp.experts.gate_up_proj"):  # transformers 5 stores [E, 2I, H] fused: gate rows, then up
            prefix = name[: -len("gate_up_proj")]
            gate, up = t.chunk(2, dim=1)
            tensors[prefix + "gate_proj"], tensors[prefix + "up_proj"] = gate.clone(), up.clone()
        else:
            tensors[name] = t.clone()
    if model.config.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)
    try:
        from tessera.engine.weights import ModelWeights
    except ImportError:
        ModelWeights = None
    cfg = model_config(model.config)
    return ModelWeights(cfg, tensors) if ModelWeights is not None else SimpleNamespace(config=cfg, tensors=tensors)


def engine_model(name: str = "odd_sizes", seed: int = 0):
    """(transformers model, Tessera model on TorchExperts) with the same weights."""
    from tessera.engine.experts import TorchExperts
    from tessera.engine.model import Qwen3MoeModel, layer_experts

    ref = hf_model(CONFIGS[name], seed)
    w = canonical_weights(ref)
    return ref, Qwen3MoeModel(w, TorchExperts(layer_experts(w.config, w.tensors)))


class LetterDecoder:
    """Stand-in detokenizer for loop tests: token i is the letter chr(97 + i % 26); `flush` returns nothing pending."""

    def add(self, token_id: int) -> str:
        return chr(97 + token_id % 26)

    def flush(self) -> str:
        return ""


@pytest.fixture(autouse=True, scope="module")
def single_thread():
    """One torch thread: tiny matmuls gain nothing from two, and on a shared 2-core machine OpenMP barriers between two
    threads cost 10-50x when other processes hold the cores. Import this name into a test module to apply it."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
