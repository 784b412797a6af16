"""The narrow interface between the model and whatever computes the routed experts.

tessera/engine/model.py does routing (softmax -> top-k -> renorm) in torch and hands each MoE layer's tokens to an
`ExpertBackend`; the native kernels (tessera/engine/native.py), the GPU hot-expert cache and its CPU twin all implement
it. The model never knows which one runs.

Letters: T tokens, H hidden size, I moe_intermediate_size, E experts in the layer, k experts per token.
Weights use the Hugging Face nn.Linear layout (out_features, in_features):
    gate_proj, up_proj: [E, I, H]      down_proj: [E, H, I]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch


@dataclass
class LayerExperts:
    """The routed experts of one MoE layer, as loaded (f32/bf16/f16 tensors, possibly memory-mapped)."""

    gate_proj: torch.Tensor  # [E, I, H]
    up_proj: torch.Tensor  # [E, I, H]
    down_proj: torch.Tensor  # [E, H, I]

    @property
    def num_experts(self) -> int:
        return self.gate_proj.shape[0]


@runtime_checkable
class ExpertBackend(Protocol):
    """Computes y[t] = sum_j w[t, j] * expert_{ids[t, j]}(x[t]) for one layer, expert(x) = down(silu(gate x) * up x).

    Every backend subclasses this protocol, so it inherits the defaults of the optional parts below; callers use them
    directly and never probe with getattr/hasattr.
    """

    name: str  # what computes the experts: "AVX512", "Torch", "AVX512+twin-cache"
    reason: str = ""  # why this backend: "picks AVX512: ..." or the backend's own one-line description
    supports_skip: bool = False  # an expert id of -1 means "this slot contributes nothing"
    pool = None  # the native thread pool the experts run on (submit returns at once); None: they run on the caller

    def forward(
        self,
        layer: int,  # index of the decoder layer (not of the MoE layer)
        x: torch.Tensor,  # [T, H] float32, contiguous
        topk_ids: torch.Tensor,  # [T, k] int64
        topk_weights: torch.Tensor,  # [T, k] float32 (already renormalised when the config says so)
    ) -> torch.Tensor:  # [T, H] float32
        ...

    def submit(self, layer: int, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> None:
        """Start `forward`; `sync()` returns its output. Returns at once only for backends with a `pool`."""
        self._submitted = self.forward(layer, x, topk_ids, topk_weights)

    def sync(self) -> torch.Tensor:
        out, self._submitted = self._submitted, None
        return out

    def decode_experts(self, layer: int):
        """This layer's experts as a native object a one-token decoder-layer step runs in its own call
        (engine.decode_layer; engine.native's QuantMoeLayer or PackedMoeLayer on `pool`), or None: the step calls
        `forward`."""
        return None

    def take_step_stats(self) -> tuple[int, int] | None:
        """(expert pairs, pairs served by the hot-expert cache) since the last call; None without such a cache."""
        return None

    def close(self, finish_writes: bool = True) -> None:
        """Release threads and buffers; the backend is not used afterwards. `finish_writes=False`: its packed-weight
        cache writes still running go on in the background (a backend switch) instead of being waited for."""


class TorchExperts(ExpertBackend):
    """Plain PyTorch experts: the pure-torch engine and the correctness twin of every native backend."""

    name = "Torch"
    supports_skip = True  # an expert id of -1 means "this slot contributes nothing"

    def __init__(self, layers: dict[int, LayerExperts], dtype: torch.dtype = torch.float32, reason: str = ""):
        # Compute dtype float32 regardless of the stored dtype, as transformers does with an fp32 model.
        self.layers = layers
        self.dtype = dtype
        self.reason = reason  # engine.native.make_backend passes engine.backends.TORCH_DESCRIPTION

    def forward(self, layer: int, x, topk_ids, topk_weights):
        experts = self.layers[layer]
        out = torch.zeros_like(x)  # [T, H]
        flat_ids = topk_ids.reshape(-1)  # [T*k]
        for e in torch.unique(flat_ids[flat_ids >= 0]).tolist():
            token_idx, slot = torch.nonzero(topk_ids == e, as_tuple=True)  # [n], [n]
            xe = x[token_idx]  # [n, H]
            g = xe @ experts.gate_proj[e].to(self.dtype).T  # [n, I]
            u = xe @ experts.up_proj[e].to(self.dtype).T  # [n, I]
            y = (torch.nn.functional.silu(g) * u) @ experts.down_proj[e].to(self.dtype).T  # [n, H]
            out.index_add_(0, token_idx, y * topk_weights[token_idx, slot].unsqueeze(-1))
        return out
