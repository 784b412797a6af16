"""A decoder layer's one-token (decode) step in one native call, where the layer can take it.

At T = 1 a layer's Python path (tessera/engine/model.py: Block) is ~60 small torch ops and Python calls around its few
native mat-vecs: on the 48-layer 30B-A3B-shaped Q4_K_M file they took 26.6 ms of a 113.5 ms step (docs/BENCHMARKS.md).
`DecodeLayerStep` runs the whole layer in `engine.native.DecodeLayer.step` (native/src/decode_layer.cpp): input RMSNorm,
q/k/v (quantized weights in one dispatch, as engine.dense.FusedLinears), q/k norms, RoPE, the K/V append into the bf16
cache (or the q8_0 cache: quantized as engine.kv_q8 does, byte for byte), the attention kernel over it, o_proj, the
residual, the post-attention RMSNorm, the router with softmax / top-k, and, when the expert backend hands over a native
description of the layer's experts (`ExpertBackend.decode_experts`), the routed experts and the second residual too. The
mat-vec kernels are the ones engine.dense uses (bit for bit for quantized and 16-bit weights); the norms, RoPE, softmax
and f32 mat-vecs sum in another order than torch (tests/engine/test_decode_layer.py holds the two paths to each other).
The whole layer runs on the expert backend's pool when it has one (else on the dense Linears' pool): one pool whose
workers stay warm across the layer's phases, instead of the dense pool and the experts' pool taking turns (and cores) on
a 2-core machine.

It applies (`DecodeLayerStep.build` / `runs`) to a layer on the CPU whose projections and router are all read
natively or held as f32 (no GPU copy), at T = 1, with a bf16 or q8_0 cache the native attention kernel reads
(engine.attention.uses_native: AVX-512 or AVX2 for a bf16 cache, AVX-512 VNNI or AVX2 for a q8_0 one); everything else
(prefill, GPU layers, an f32 cache, a CPU without AVX2) keeps the Python path.

Letters: H hidden size, k experts per token, hd head dim.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tessera.engine import native
from tessera.engine.attention import uses_native
from tessera.engine.dense import Linear, dense_pool
from tessera.engine.kv_cache import KVCache

READABLE_PATHS = ("native-quant", "native", "torch-f32")  # Linear paths whose weights the native step reads


def _weight_arg(lin: Linear) -> tuple[int, torch.Tensor]:
    """(GGML type id, raw block rows) for a quantized weight, (-1, the tensor) for a float one."""
    if lin.path == "native-quant":
        return int(lin.weight.qtype), lin.weight.raw
    return -1, lin.weight


@dataclass
class StepOutput:
    h: torch.Tensor  # [1, H] x + attention
    normed: torch.Tensor  # [1, H] post_attention_layernorm(h)
    routing: tuple[torch.Tensor, torch.Tensor] | None  # ids [1, k] int64, weights [1, k] f32; None: a dense-MLP layer
    out: torch.Tensor | None  # [1, H] h + experts(normed) when the experts ran in the same call, else None


class DecodeLayerStep:
    """The native one-token step of one decoder layer (built once per layer; see the module docstring)."""

    def __init__(self, layer: int, plan, hidden: int, top_k: int):
        self.layer, self.plan, self.H, self.top_k = layer, plan, hidden, top_k  # top_k 0: a dense-MLP layer
        self._pool = dense_pool()  # the Linears' pool: used when the experts run on no native pool

    @classmethod
    def build(cls, cfg, layer: int, device: torch.device, norms: dict[str, torch.Tensor], attn: list[Linear],
              router: Linear | None) -> DecodeLayerStep | None:
        """The step for a layer on `device` with `norms` (input, post, q, k: f32), projections `attn` (q, k, v, o) and
        `router` (None for a dense-MLP layer); None where the layer cannot take it."""
        linears = attn + ([router] if router is not None else [])
        if device.type != "cpu" or cfg.head_dim % 2 or any(lin.path not in READABLE_PATHS for lin in linears):
            return None
        top_k = cfg.num_experts_per_tok if router is not None else 0
        plan = native.decode_layer_plan(
            cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.rms_norm_eps,
            norms["input"], norms["post"], norms["q"], norms["k"], [_weight_arg(lin) for lin in attn],
            _weight_arg(router) if router is not None else None,
            top_k, bool(cfg.norm_topk_prob))
        return cls(layer, plan, cfg.hidden_size, top_k)

    def runs(self, x: torch.Tensor, cache: KVCache) -> bool:
        """Whether this step takes x [T, H] now: one token, and a cache the native attention reads."""
        return x.shape[0] == 1 and uses_native(cache, self.layer)

    def __call__(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: KVCache, experts) -> StepOutput:
        """x [1, H] f32 at position cache.length (reserved), cos/sin [1, hd]: writes the position's K/V into `cache`
        (committed by the caller, as KVCache.write) and returns the layer's parts."""
        H, k = self.H, self.top_k
        h, normed = torch.empty(1, H), torch.empty(1, H)  # [1, H] x 2
        ids = torch.empty(1, k, dtype=torch.int64) if k else None  # [1, k]
        weights = torch.empty(1, k) if k else None  # [1, k]
        moe = experts.decode_experts(self.layer) if k else None
        out = torch.empty(1, H) if moe is not None else None  # [1, H]
        pool = experts.pool if experts.pool is not None else self._pool  # one pool for the whole layer
        scales = dict(k_scales=cache.ks[self.layer], v_scales=cache.vs[self.layer]) if cache.quantized else {}
        self.plan.step(x.contiguous(), cos, sin, cache.k[self.layer], cache.v[self.layer], cache.length, h, normed,
                       ids, weights, moe, out, pool, **scales)
        return StepOutput(h, normed, (ids, weights) if k else None, out)


class DecodeStack:
    """Every decoder layer of a model in one native call per decode step (`engine.native.decode_stack_step`): where
    every layer is an MoE layer whose step takes this token and whose experts the backend hands over as a native
    object. No return to Python between layers, so the pool's workers stay warm from the first layer to the last
    (the per-layer step returns to Python 48 times a token on 30B-A3B). Anything else: the blocks run one by one."""

    def __init__(self, steps: list[DecodeLayerStep], num_experts: int):
        self.steps, self.num_experts = steps, num_experts
        self.plans = [step.plan for step in steps]
        self._experts: tuple[object, list | None] = (None, None)  # (backend, its decode_experts per layer)

    @classmethod
    def build(cls, steps: list[DecodeLayerStep | None], num_experts: int) -> DecodeStack | None:
        if not steps or any(step is None or not step.top_k for step in steps):
            return None
        return cls(list(steps), num_experts)

    def _moe(self, experts) -> list | None:
        if self._experts[0] is not experts:  # decided once per backend (a backend switch decides again)
            moe = [experts.decode_experts(step.layer) for step in self.steps]
            self._experts = (experts, None if any(m is None for m in moe) else moe)
        return self._experts[1]

    def runs(self, x: torch.Tensor, cache: KVCache, experts) -> bool:
        return (x.shape[0] == 1 and experts.pool is not None and self._moe(experts) is not None
                and all(step.runs(x, cache) for step in self.steps))

    def __call__(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: KVCache, experts,
                 stats) -> torch.Tensor:
        """x [1, H] f32 at position cache.length (reserved) -> the last layer's output [1, H]; writes every layer's
        K/V (committed by the caller) and, with `stats`, the routed pairs and per-layer counts (model.RoutingStats)."""
        L, k = len(self.steps), self.steps[0].top_k
        ids = torch.empty(L, k, dtype=torch.int64)  # [L, k]
        weights = torch.empty(L, k)  # [L, k]
        counts = torch.empty(L, self.num_experts, dtype=torch.int64)  # [L, E]
        out = torch.empty(1, self.steps[0].H)  # [1, H]
        layers = [step.layer for step in self.steps]
        scales = dict(kss=[cache.ks[i] for i in layers], vss=[cache.vs[i] for i in layers]) if cache.quantized else {}
        native.decode_stack_step(self.plans, self._moe(experts), x.contiguous(), cos, sin,
                                 [cache.k[i] for i in layers], [cache.v[i] for i in layers], cache.length, ids,
                                 weights, counts, out, experts.pool, **scales)
        if stats is not None:
            stats.pairs += ids.numel()
            stats.counts.update(zip(layers, counts))  # layer -> [E]
        return out
