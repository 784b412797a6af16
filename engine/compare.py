"""Compare two models (GGUF or HF folder, any types) by teacher-forcing the same tokens through both.

Reports the max absolute logit difference (also relative to the logit range), top-1 agreement and the mean KL divergence
KL(A || B) of the next-token distributions over all positions. `convert --verify` and `tessera-cli compare` use it, so a
user can judge a quantization.

Tolerances (`verdict`), for a conversion whose source is A:
- lossless (the output type holds every source value: bf16 -> bf16/f32, f16 -> f16/f32, f32 -> f32): max |dlogit| <=
  1e-3 x logit range and top-1 agreement 1.0. Measured on make-model models: max |dlogit| exactly 0 (same engine, same
  values), f16 output from bf16 source 3e-7.
- lossy (q8_0, or a narrower float type than the source): top-1 agreement >= 0.9 and mean KL <= 0.02 nats. Measured on
  make-model tiny models (53 tokens): q8_0 mean KL 1-2e-5, top-1 agreement 0.98-1.0; f32 -> bf16 mean KL 2.5e-6.
  Random-weight models have nearly flat logits, so top-1 flips there are cheap; real models agree more.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import torch

SAMPLE_TEXT = (
    "The quick brown fox jumps over the lazy dog. 今天天气很好。 def f(x):\n    return x * 2  # 🙂\n"
    "A mixture of experts routes every token to a few small networks, chosen by a router."
)


@dataclass(frozen=True)
class CompareReport:
    tokens: int
    max_abs_diff: float
    logit_range: float  # max - min of A's logits
    rel_max_diff: float  # max_abs_diff / logit_range
    top1_agreement: float  # fraction of positions where argmax agrees
    mean_kl: float  # mean over positions of KL(softmax A || softmax B), nats

    def as_dict(self) -> dict:
        return asdict(self)


def compare_logits(a: torch.Tensor, b: torch.Tensor) -> CompareReport:
    """Statistics between two [T, V] logit tensors (V may differ: the common prefix of the vocabulary is compared)."""
    v = min(a.shape[-1], b.shape[-1])
    a = a[:, :v].to(torch.float64)  # [T, V]
    b = b[:, :v].to(torch.float64)  # [T, V]
    diff = (a - b).abs().max().item()
    rng = (a.max() - a.min()).item() or 1.0
    top1 = (a.argmax(-1) == b.argmax(-1)).to(torch.float64).mean().item()
    la, lb = torch.log_softmax(a, -1), torch.log_softmax(b, -1)  # [T, V]
    kl = (la.exp() * (la - lb)).sum(-1).clamp_min(0).mean().item()  # [T] -> scalar
    return CompareReport(a.shape[0], diff, rng, diff / rng, top1, kl)


LOSSLESS = {("BF16", "bf16"), ("BF16", "f32"), ("F16", "f16"), ("F16", "f32"), ("F32", "f32")}


def verdict(report: CompareReport, *, lossless: bool) -> tuple[bool, str]:
    """Whether `report` is within the stated tolerance (see the module docstring), and the rule applied."""
    if lossless:
        ok = report.rel_max_diff <= 1e-3 and report.top1_agreement == 1.0
        return ok, "lossless conversion: needs max|dlogit| <= 1e-3 x logit range and top-1 agreement 1.0"
    ok = report.top1_agreement >= 0.9 and report.mean_kl <= 0.02
    return ok, "lossy conversion: needs top-1 agreement >= 0.9 and mean KL <= 0.02 nats"


def verify_conversion(
    src: str | Path, out: str | Path, dtype: str, *, text: str | None = None
) -> tuple[CompareReport, bool, str]:
    """Compare a converted GGUF `out` with its HF source `src`; lossless when every source tensor's dtype fits
    `dtype`."""
    from engine.convert import read_source

    source_dtypes = set(read_source(src).dtypes.values())
    lossless = all((d, dtype.lower()) in LOSSLESS for d in source_dtypes)
    report = compare(src, out, text=text)
    ok, why = verdict(report, lossless=lossless)
    return report, ok, why


def teacher_forced_logits(path: str | Path, token_ids: list[int]) -> torch.Tensor:
    """[T, V] float32 logits of every position of `token_ids` through the model at `path` (pure-torch engine)."""
    from engine.experts import TorchExperts
    from engine.model import Qwen3MoeModel, layer_experts
    from engine.weights import load_weights

    weights = load_weights(path)
    model = Qwen3MoeModel(weights, TorchExperts(layer_experts(weights.config, weights.tensors)))
    cache = model.new_cache(len(token_ids))
    return model.forward(torch.tensor(token_ids, dtype=torch.long), cache, last_only=False)  # [T, V]


def tokenize(path: str | Path, text: str) -> list[int]:
    """`text` as token ids with the tokenizer of the model at `path`."""
    from engine.tokenizer import Tokenizer

    ids = list(Tokenizer.from_path(Path(path)).encode(text))
    if not ids:
        from engine.errors import TesseraError

        raise TesseraError("--text", "is empty after tokenization")
    return ids


def compare(a: str | Path, b: str | Path, *, text: str | None = None) -> CompareReport:
    """Teacher-force `text` (tokenized by A's tokenizer) through A and B and compare their logits."""
    ids = tokenize(a, text if text is not None else SAMPLE_TEXT)
    logits_a = teacher_forced_logits(a, ids)
    logits_b = teacher_forced_logits(b, ids)
    return compare_logits(logits_a, logits_b)


def format_report(r: CompareReport) -> str:
    return (
        f"tokens {r.tokens}  max|dlogit| {r.max_abs_diff:.3g} ({r.rel_max_diff:.2e} of range {r.logit_range:.3g})  "
        f"top-1 agreement {r.top1_agreement:.3f}  mean KL {r.mean_kl:.3g} nats"
    )
