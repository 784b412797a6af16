"""The Qwen3-MoE forward pass in PyTorch, top to bottom, for one sequence at a time (batch 1).

Order: RMSNorm, RoPE, Attention (per-head q/k norm, GQA, KV cache), Router, MoE, dense MLP, Block, Model.
Norm weights are converted to float32 once at construction; the 2-D dense weights (attention projections, router,
dense MLP, lm_head) stay as stored (float, or a GGUF's quantized blocks) inside `engine.dense.Linear`, which chooses how
to multiply by them, and so does the embedding table (`engine.dense.embedding_rows` looks rows up); the routed
experts stay as stored and are computed by an `engine.experts.ExpertBackend`. The model only calls both (no backend
branches here); at T = 1 a layer that can runs in one native call (engine.decode_layer.DecodeLayerStep, chosen in
Block), and a model whose every layer can runs them all in one (engine.decode_layer.DecodeStack, chosen in forward).

Letters: T tokens in this step, S cached + new positions, H hidden size, V vocabulary, nh query heads, nkv key/value
heads, hd head dim, E experts, k experts per token, Id dense intermediate size.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from tessera.engine import native
from tessera.engine.attention import attend, prepare_attend_native, prepares_native
from tessera.engine.decode_layer import DecodeLayerStep, DecodeStack
from tessera.engine.dense import (
    FusedLinears,
    Linear,
    dense_pool,
    embedding_rows,
    place_table,
    step_torch_threads,
    torch_threads,
)
from tessera.engine.errors import Cancelled
from tessera.engine.experts import ExpertBackend, LayerExperts
from tessera.engine.kv_cache import KVCache


def _f32(t: torch.Tensor, device: torch.device | str = "cpu") -> torch.Tensor:
    return t.to(device=device, dtype=torch.float32).contiguous()


@dataclass(frozen=True)
class ModelDevices:
    """Where the dense parts run: the embedding table, each decoder layer (attention, norms, router, dense MLP, KV
    cache) and the final norm + lm_head. The routed experts are the ExpertBackend's business. Built from a
    PlacementPlan."""

    embed: str = "cpu"
    layers: tuple[str, ...] = ()  # one per decoder layer; empty means all "cpu"
    head: str = "cpu"

    def layer(self, i: int) -> str:
        return self.layers[i] if self.layers else "cpu"


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    variance = x.pow(2).mean(-1, keepdim=True)  # [..., 1]
    return weight * (x * torch.rsqrt(variance + eps))  # [..., D]


class Rope:
    """Rotary position embedding, neox style (rotate_half over the two halves of head_dim), as HF Qwen3."""

    def __init__(self, head_dim: int, theta: float):
        self.inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))  # [hd/2]

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions[:, None].float() * self.inv_freq  # [T, hd/2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [T, hd]
        return emb.cos(), emb.sin()  # [T, hd], [T, hd]

    @staticmethod
    def apply(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)  # [n, T, hd]
        return x * cos + rotated * sin  # [n, T, hd]


@dataclass
class RoutingStats:
    """Routed (token, expert) pairs of one forward step, for metrics and the expert cache."""

    pairs: int = 0  # token-expert pairs over all MoE layers
    counts: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> [E] int64 tokens routed to each expert

    def experts_hit(self) -> int:
        return sum(int((c > 0).sum()) for c in self.counts.values())


class Attention:
    def __init__(self, cfg, p: dict[str, torch.Tensor], rope: Rope, device: str, prefix: str = ""):
        self.nh, self.nkv, self.hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.eps = cfg.rms_norm_eps
        self.rope = rope
        names = ("q_proj", "k_proj", "v_proj", "o_proj")
        proj = {n: Linear(p[f"{n}.weight"], device, f"{prefix}{n}.weight") for n in names}
        self.q_proj, self.k_proj = proj["q_proj"], proj["k_proj"]  # [nh*hd, H], [nkv*hd, H]
        self.v_proj, self.o_proj = proj["v_proj"], proj["o_proj"]  # [nkv*hd, H], [H, nh*hd]
        self.qkv = FusedLinears([self.q_proj, self.k_proj, self.v_proj])  # one native call for the three
        self.q_norm, self.k_norm = _f32(p["q_norm.weight"], device), _f32(p["k_norm.weight"], device)  # [hd], [hd]
        self.pool = dense_pool() if torch.device(device).type == "cpu" else None  # the native attention's threads

    def __call__(self, layer: int, x: torch.Tensor, cos, sin, cache: KVCache, mask) -> torch.Tensor:
        T = x.shape[0]
        q, k, v = self.qkv(x)  # [T, nh*hd], [T, nkv*hd], [T, nkv*hd]
        if prepares_native(cache, layer):  # norms, RoPE, the append and the kernel in two native calls
            out = prepare_attend_native(q, k, v, self.q_norm, self.k_norm, self.eps, cos, sin, cache, layer, self.pool)
            return self.o_proj(out)  # [T, H]
        q = q.view(T, self.nh, self.hd)  # [T, nh, hd]
        k = k.view(T, self.nkv, self.hd)  # [T, nkv, hd]
        v = v.view(T, self.nkv, self.hd)  # [T, nkv, hd]
        q = rms_norm(q, self.q_norm, self.eps).transpose(0, 1)  # [nh, T, hd]
        k = rms_norm(k, self.k_norm, self.eps).transpose(0, 1)  # [nkv, T, hd]
        q, k = Rope.apply(q, cos, sin), Rope.apply(k, cos, sin)  # [nh, T, hd], [nkv, T, hd]
        start = cache.length
        cache.write(layer, k, v.transpose(0, 1))  # positions [start, start+T)
        return self.o_proj(attend(q, cache, layer, start, mask, self.pool))  # [T, H]


class Router:
    """softmax over experts -> top-k -> renormalise the k weights when norm_topk_prob."""

    def __init__(self, cfg, weight: torch.Tensor, device: str, name: str = "mlp.gate.weight"):
        self.proj = Linear(weight, device, name)  # [E, H]
        self.top_k, self.norm_topk_prob = cfg.num_experts_per_tok, cfg.norm_topk_prob

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        probs = torch.softmax(self.proj(x), dim=-1)  # [T, E]
        weights, ids = torch.topk(probs, self.top_k, dim=-1)  # [T, k], [T, k]
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)  # [T, k]
        return ids, weights


class MoE:
    def __init__(self, cfg, p: dict[str, torch.Tensor], device: str, prefix: str = ""):
        self.router = Router(cfg, p["gate.weight"], device, f"{prefix}gate.weight")
        self.num_experts = cfg.num_experts

    def __call__(self, layer: int, x: torch.Tensor, experts: ExpertBackend, stats: RoutingStats | None,
                 routing: tuple[torch.Tensor, torch.Tensor] | None = None):
        ids, weights = routing if routing is not None else self.router(x)  # [T, k], [T, k]
        self.record(layer, ids, stats)
        return experts.forward(layer, x, ids, weights)  # [T, H]

    def record(self, layer: int, ids: torch.Tensor, stats: RoutingStats | None) -> None:
        if stats is not None:
            stats.pairs += ids.numel()
            stats.counts[layer] = torch.bincount(ids.reshape(-1), minlength=self.num_experts)  # [E]


class DenseMLP:
    def __init__(self, p: dict[str, torch.Tensor], device: str, prefix: str = ""):
        self.gate_proj = Linear(p["gate_proj.weight"], device, f"{prefix}gate_proj.weight")  # [Id, H]
        self.up_proj = Linear(p["up_proj.weight"], device, f"{prefix}up_proj.weight")  # [Id, H]
        self.down_proj = Linear(p["down_proj.weight"], device, f"{prefix}down_proj.weight")  # [H, Id]

    def __call__(self, layer: int, x: torch.Tensor, experts: ExpertBackend, stats: RoutingStats | None,
                 routing=None):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))  # [T, H]


class Block:
    def __init__(self, cfg, layer: int, p: dict[str, torch.Tensor], rope: Rope, device: str):
        self.layer, self.eps, self.device = layer, cfg.rms_norm_eps, torch.device(device)
        self.input_layernorm = _f32(p["input_layernorm.weight"], device)  # [H]
        self.post_attention_layernorm = _f32(p["post_attention_layernorm.weight"], device)  # [H]
        prefix = f"model.layers.{layer}."
        self.self_attn = Attention(cfg, _sub(p, "self_attn."), rope, device, prefix + "self_attn.")
        # On the CPU the norms and residual adds run natively on the dense pool (one pass over the rows each; torch
        # ran them on the step's one thread, four passes a norm: ~10 % of a long prefill).
        self.pool = dense_pool() if self.device.type == "cpu" else None
        mlp = _sub(p, "mlp.")
        moe = cfg.is_moe_layer(layer)
        self.mlp = MoE(cfg, mlp, device, prefix + "mlp.") if moe else DenseMLP(mlp, device, prefix + "mlp.")
        a = self.self_attn
        self.decode_step = DecodeLayerStep.build(  # the whole layer in one native call at T = 1, where it can run
            cfg, layer, self.device,
            {"input": self.input_layernorm, "post": self.post_attention_layernorm, "q": a.q_norm, "k": a.k_norm},
            [a.q_proj, a.k_proj, a.v_proj, a.o_proj], self.mlp.router.proj if moe else None)

    def linears(self) -> list[Linear]:
        a, m = self.self_attn, self.mlp
        return [a.q_proj, a.k_proj, a.v_proj, a.o_proj] + (
            [m.router.proj] if isinstance(m, MoE) else [m.gate_proj, m.up_proj, m.down_proj])

    def __call__(self, x, cos, sin, cache: KVCache, mask, experts: ExpertBackend, stats: RoutingStats | None):
        x = x.to(self.device)  # a no-op unless the previous layer ran elsewhere
        if self.decode_step is not None and self.decode_step.runs(x, cache):
            step = self.decode_step(x, cos, sin, cache, experts)  # one native call for the layer
            if step.out is not None:  # the routed experts ran in that call too
                self.mlp.record(self.layer, step.routing[0], stats)
                return step.out  # [1, H]
            return step.h + self.mlp(self.layer, step.normed, experts, stats, step.routing)  # [1, H]
        if self.pool is not None and x.dtype == torch.float32:
            return self._native_residuals(x, cos, sin, cache, mask, experts, stats)
        h = x + self.self_attn(self.layer, rms_norm(x, self.input_layernorm, self.eps), cos, sin, cache, mask)  # [T, H]
        return h + self.mlp(self.layer, rms_norm(h, self.post_attention_layernorm, self.eps), experts, stats)  # [T, H]

    def _native_residuals(self, x, cos, sin, cache: KVCache, mask, experts: ExpertBackend, stats: RoutingStats | None):
        """The layer as above with its norms and residual adds native: h = x + attn(norm(x)) and out = h + mlp(norm(h)),
        h and out written into the attention's and the MLP's fresh outputs."""
        x = x.contiguous()  # [T, H]
        normed = torch.empty_like(x)  # [T, H]
        native.rms_norm_rows(x, self.input_layernorm, self.eps, normed, self.pool)
        h = self.self_attn(self.layer, normed, cos, sin, cache, mask).contiguous()  # [T, H]
        native.rms_norm_rows(h, self.post_attention_layernorm, self.eps, normed, self.pool, add=x)  # h += x
        out = self.mlp(self.layer, normed, experts, stats).contiguous()  # [T, H]
        native.add_rows(out, h, self.pool)  # out += h
        return out


def _sub(p: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    return {name[len(prefix):]: t for name, t in p.items() if name.startswith(prefix)}


class Qwen3MoeModel:
    """Built from `ModelWeights` (config + canonical tensors). `experts` computes the routed experts of every MoE
    layer."""

    def __init__(
        self,
        weights,
        experts: ExpertBackend,
        devices: ModelDevices = ModelDevices(),
        kv_dtype: torch.dtype = torch.bfloat16,
    ):
        cfg = self.config = weights.config
        t = weights.tensors
        self.devices = devices
        self.kv_dtype = kv_dtype  # of every KVCache new_cache makes
        self.rope = Rope(cfg.head_dim, cfg.rope_theta)
        # The embedding table stays as stored: rows are converted when looked up (exact for f16/bf16), a quantized
        # table (QuantizedMatrix) dequantizes just the looked-up rows; on a GPU a quantized table is bf16 there.
        self.embed_tokens = place_table(t["model.embed_tokens.weight"], devices.embed)  # [V, H]
        if not cfg.tie_word_embeddings:
            head = t["lm_head.weight"]
        elif torch.device(devices.head) == torch.device(devices.embed):
            head = self.embed_tokens  # tied on one device: the table itself (its blocks, on the CPU), no second copy
        else:
            head = t["model.embed_tokens.weight"]
        self.lm_head = Linear(head, devices.head, "lm_head.weight")  # [V, H]
        self.norm = _f32(t["model.norm.weight"], devices.head)  # [H]
        self.layers = [
            Block(cfg, i, _sub(t, f"model.layers.{i}."), self.rope, devices.layer(i))
            for i in range(cfg.num_hidden_layers)
        ]
        self.linears = [self.lm_head] + [lin for block in self.layers for lin in block.linears()]
        # Decode: every layer in one native call where all of them can take it (else each Block chooses for itself).
        self.decode_stack = DecodeStack.build([block.decode_step for block in self.layers], cfg.num_experts)
        self.set_experts(experts)

    def set_experts(self, experts: ExpertBackend) -> None:
        """Use `experts` for the routed experts from the next step on (a backend switch keeps the rest of the model)."""
        self.experts = experts
        self.step_threads = step_torch_threads(self.linears, experts)  # 1 or None (torch's count), decided here once

    def new_cache(self, capacity: int, dtype: torch.dtype | None = None) -> KVCache:
        """An empty KV cache for this model, in `dtype` (default: the model's kv_dtype, bf16 unless built otherwise)."""
        cfg = self.config
        return KVCache(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, capacity,
                       [block.device for block in self.layers], dtype or self.kv_dtype)

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,  # [T] int64, the tokens after those already in `cache`
        cache: KVCache,
        *,
        last_only: bool = True,
        stats: RoutingStats | None = None,
        cancelled: Callable[[], bool] | None = None,
    ) -> torch.Tensor:  # [1, V] float32 (last position) or [T, V] when last_only is False
        """`cancelled` is asked between decoder layers: when it says yes the step stops there and raises
        errors.Cancelled, leaving `cache` as it was before the step (its length and tokens unchanged: what the
        finished layers wrote past its length is never read and is overwritten by the next step)."""
        with torch_threads(self.step_threads):  # one torch thread when the heavy work is all native
            return self._forward(input_ids, cache, last_only, stats, cancelled)

    def _forward(self, input_ids, cache: KVCache, last_only: bool, stats: RoutingStats | None,
                 cancelled: Callable[[], bool] | None = None) -> torch.Tensor:
        T, start = input_ids.shape[0], cache.length
        cache.reserve(start + T)
        positions = torch.arange(start, start + T)  # [T]
        cos, sin = self.rope.cos_sin(positions)  # [T, hd], [T, hd]
        mask = None
        if T > 1:  # query t (at position start+t) sees keys 0..start+t
            mask = torch.arange(start + T)[None, :] <= positions[:, None]  # [T, S] bool
        on_device = {}  # device -> (cos, sin, mask) copied there once per step
        x = embedding_rows(self.embed_tokens, input_ids)  # [T, H] f32
        if self.decode_stack is not None and self.decode_stack.runs(x, cache, self.experts):
            x = self.decode_stack(x, cos, sin, cache, self.experts, stats)  # [1, H]: every layer, one native call
        else:
            for block in self.layers:
                if block.device not in on_device:
                    on_device[block.device] = tuple(None if a is None else a.to(block.device) for a in (cos, sin, mask))
                c, s, m = on_device[block.device]
                if cancelled is not None and cancelled():  # a long prefill step stops within one layer
                    raise Cancelled("generation cancelled")
                x = block(x, c, s, cache, m, self.experts, stats)  # [T, H]
        cache.commit(input_ids.tolist())
        if last_only:
            x = x[-1:]  # [1, H]
        x = x.to(self.lm_head.device)
        return self.lm_head(rms_norm(x, self.norm, self.config.rms_norm_eps)).to("cpu")  # [T or 1, V]


def layer_experts(cfg, tensors: dict[str, torch.Tensor]) -> dict[int, LayerExperts]:
    """The stacked routed experts of every MoE layer, as loaded (not converted), keyed by decoder layer index."""
    out = {}
    for i in range(cfg.num_hidden_layers):
        if cfg.is_moe_layer(i):
            p = f"model.layers.{i}.mlp.experts."
            out[i] = LayerExperts(tensors[p + "gate_proj"], tensors[p + "up_proj"], tensors[p + "down_proj"])
    return out
