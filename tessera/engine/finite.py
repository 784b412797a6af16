"""NaN and Inf never reach the sampler unnamed: each step's logits are checked (one pass over [V], a few microseconds),
and when they are not finite the tokens are run again layer by layer to say where the damage is: a weight tensor that
holds NaN/Inf (named, with the expert), or the first layer whose output overflows though its weights are finite.

Checking every weight at load would read the whole model once more; the first step that touches a damaged tensor
finds it instead, and no token computed from it is ever shown.
"""

from __future__ import annotations

import torch

from tessera.engine.errors import TesseraError

MAX_REPLAY_TOKENS = 4096  # a longer history is replayed from its start only (the damage shows in the first tokens)


class NonFiniteError(TesseraError):
    """The model produced NaN or Inf: the subject names the tensor (a damaged file) or the layer (an overflow)."""


class _Found(Exception):
    def __init__(self, layer: int):
        self.layer = layer


class _Checked:
    """Stands in for a Block during the replay: the same call, then a finiteness check of its output."""

    def __init__(self, block):
        self._block = block

    def __getattr__(self, name):
        return getattr(self._block, name)

    def __call__(self, *args, **kwargs):
        out = self._block(*args, **kwargs)  # [T, H]
        if not bool(torch.isfinite(out).all()):
            raise _Found(self._block.layer)
        return out


def check_logits(logits: torch.Tensor, model, history: list[int]) -> None:
    """Raises NonFiniteError naming the cause when `logits` holds NaN or Inf; `history` is every token the model has
    seen in this request, the last step's included."""
    if bool(torch.isfinite(logits).all()):
        return
    raise locate(model, history)


def _bad(t: torch.Tensor | None) -> bool:
    return t is not None and t.is_floating_point() and not bool(torch.isfinite(t).all())


def _expert_problem(layer: int, experts) -> NonFiniteError | None:
    if experts is None:
        return None
    for part in ("gate_proj", "up_proj", "down_proj"):
        w = getattr(experts, part)  # [E, rows, cols]
        if not isinstance(w, torch.Tensor):  # quantized blocks: their scales were checked at load (engine.quantized)
            continue
        if _bad(w):
            per_expert = ~torch.isfinite(w.reshape(w.shape[0], -1)).all(dim=1)  # [E]
            e = int(per_expert.nonzero()[0, 0])
            return NonFiniteError(f"tensor model.layers.{layer}.mlp.experts.{part}",
                                  f"expert {e} holds NaN or Inf values: the model file is damaged")
    return None


def _block_problem(block, source_experts: dict) -> NonFiniteError | None:
    layer = block.layer
    for name in ("input_layernorm", "post_attention_layernorm"):
        if _bad(getattr(block, name, None)):
            return NonFiniteError(f"tensor model.layers.{layer}.{name}.weight",
                                  "holds NaN or Inf values: the model file is damaged")
    linears = block.linears() if hasattr(block, "linears") else []
    for lin in linears:
        if _bad(getattr(lin, "weight", None)):
            return NonFiniteError(f"tensor {lin.name}", "holds NaN or Inf values: the model file is damaged")
    return _expert_problem(layer, source_experts.get(layer))


def locate(model, history: list[int]) -> NonFiniteError:
    """Replays `history` through a scratch cache, stopping at the first layer whose output is not finite."""
    ids = torch.tensor(history[:MAX_REPLAY_TOKENS], dtype=torch.long)  # [T]
    embed = getattr(model, "embed_tokens", None)
    if embed is not None and embed.is_floating_point():
        rows = embed[ids.to(embed.device)]  # [T, H]
        bad_rows = ~torch.isfinite(rows).all(dim=-1)  # [T]
        if bool(bad_rows.any()):
            token = int(ids[bad_rows.nonzero()[0, 0]])
            return NonFiniteError("tensor model.embed_tokens.weight",
                                  f"the row of token {token} holds NaN or Inf values: the model file is damaged")
    source_experts = dict(getattr(model, "source_experts", None) or getattr(model.experts, "layers", None) or {})
    blocks = model.layers
    model.layers = [_Checked(b) for b in blocks]
    try:
        model.forward(ids, model.new_cache(len(ids) + 1), last_only=True)
    except _Found as found:
        block = blocks[found.layer]
        return _block_problem(block, source_experts) or NonFiniteError(
            f"layer {found.layer}", "its output is NaN or Inf although its weights are finite (the activations "
            "overflow: a damaged or mis-scaled model)")
    except (RuntimeError, ValueError, TesseraError) as e:
        return NonFiniteError("model output", f"is NaN or Inf, and replaying the request to find where failed ({e})")
    finally:
        model.layers = blocks
    for name, t in (("model.norm.weight", getattr(model, "norm", None)),
                    ("lm_head.weight", getattr(getattr(model, "lm_head", None), "weight", None))):
        if _bad(t):
            return NonFiniteError(f"tensor {name}", "holds NaN or Inf values: the model file is damaged")
    return NonFiniteError("model output", "is NaN or Inf after the last layer (lm_head overflow)")

