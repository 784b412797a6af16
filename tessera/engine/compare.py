"""Compare two models (GGUF or HF folder, any types) by teacher-forcing the same tokens through both.

Both run as `engine.load(path, backend=NAME)` runs them: the expert backend a user picks (default Auto, the one the
app and `chat` use unless told otherwise; `Torch` is the pure-PyTorch engine), its dense path and its bf16 KV cache.
So a comparison judges the kernels a user will run, not a reference path.

Reports the max absolute logit difference (also relative to the logit range), top-1 agreement and the mean KL divergence
KL(A || B) of the next-token distributions over all positions. `convert --verify`, the conversion wizard and
`tessera-cli compare` use it, so a user can judge a conversion.

Tolerances of `verify_conversion`, for a conversion whose source is A:
- lossless (the output type holds every source value: bf16 -> bf16/f32, f16 -> f16/f32, f32 -> f32): max |dlogit| <=
  1e-3 x logit range and top-1 agreement 1.0. Measured on make-model models: max |dlogit| exactly 0 (same engine, same
  values), f16 output from bf16 source 3e-7.
- lossy float (a narrower float type than the source, f32 -> bf16/f16): top-1 agreement >= 0.9 and mean KL <= 0.02
  nats. Measured on make-model tiny models: f32 -> bf16 mean KL 2.5e-6.
- block-quantized outputs (q8_0, q4_0, q4_k_m, q5_k_m, q6_k, iq4_xs): tessera/engine/verify_quantized.py's two checks:
  every quantized tensor within its type's error of the source, and the output through the backend against its
  dequantized-F32 twin with top-1 agreement >= 0.90 and mean KL <= 0.01 nats. Random-weight models have nearly flat
  logits (range ~2), so a 4-bit file's top-1 against the source flips on near-ties whatever the kernels do; the twin
  separates the file's rounding (check 1) from the kernels' (check 2).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
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
    backend: str = ""  # the expert backend both ran with (Auto resolved); "" for logits compared directly

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
    """Whether `report` is within the stated tolerance of a float conversion (see the module docstring), and the rule
    applied."""
    if lossless:
        ok = report.rel_max_diff <= 1e-3 and report.top1_agreement == 1.0
        return ok, "lossless conversion: needs max|dlogit| <= 1e-3 x logit range and top-1 agreement 1.0"
    ok = report.top1_agreement >= 0.9 and report.mean_kl <= 0.02
    return ok, "lossy conversion: needs top-1 agreement >= 0.9 and mean KL <= 0.02 nats"


def twin_verdict(report: CompareReport) -> tuple[bool, str]:
    """Whether a quantized file through its backend (B) stays within the rule against its dequantized-F32 twin (A)."""
    from tessera.engine.verify_quantized import TWIN_KL, TWIN_TOP1

    ok = report.top1_agreement >= TWIN_TOP1 and report.mean_kl <= TWIN_KL
    return ok, (f"through {report.backend} against its dequantized-F32 twin: needs top-1 agreement >= {TWIN_TOP1:.2f} "
                f"and mean KL <= {TWIN_KL} nats")


def verify_conversion(
    src: str | Path, out: str | Path, dtype: str, *, text: str | None = None, backend: str = "Auto"
) -> tuple[CompareReport, bool, str]:
    """Judge a converted GGUF `out` against its HF source `src` through expert backend `backend`: (the logits report
    the verdict rests on, passed, the rule in words). Float outputs: source against output, lossless when every source
    tensor's dtype fits `dtype`. Block-quantized outputs: tessera/engine/verify_quantized.py's two checks."""
    from tessera.engine.convert import read_source
    from tessera.engine.verify_quantized import is_block_quantized

    if is_block_quantized(dtype):
        return _verify_quantized(src, out, text=text, backend=backend)
    source_dtypes = set(read_source(src).dtypes.values())
    lossless = all((d, dtype.lower()) in LOSSLESS for d in source_dtypes)
    report = compare(src, out, text=text, backend=backend)
    ok, why = verdict(report, lossless=lossless)
    return report, ok, why


def _verify_quantized(src, out, *, text: str | None, backend: str) -> tuple[CompareReport, bool, str]:
    from tessera.engine.verify_quantized import describe_worst, tensor_fidelity, twin_logits

    errors = tensor_fidelity(src, out)
    bad = [e for e in errors if not e.ok]
    fidelity = (f"{len(bad)} of {len(errors)} quantized tensors outside their type's error of the source: "
                + "; ".join(f"{e.name} ({e.qtype}) {e.rel_rms:.3g} > {e.bound:.3g}" for e in bad[:3])
                if bad else f"every quantized tensor within its type's error of the source ({describe_worst(errors)})")
    ids = tokenize(src, text if text is not None else SAMPLE_TEXT)
    twin = twin_logits(out, ids)
    run, name = run_logits(out, ids, backend)
    report = replace(compare_logits(twin, run), backend=name)
    ok, why = twin_verdict(report)
    return report, ok and not bad, f"quantized output: {fidelity}; {why}"


def run_logits(path: str | Path, token_ids: list[int], backend: str = "Auto") -> tuple[torch.Tensor, str]:
    """([T, V] float32 logits of every position of `token_ids`, the backend that ran) through the model at `path`
    loaded as `engine.load(path, backend=backend)` loads it."""
    from tessera.engine.session import load

    session = load(path, backend=backend)
    try:
        cache = session.model.new_cache(len(token_ids))
        logits = session.model.forward(torch.tensor(token_ids, dtype=torch.long), cache, last_only=False)  # [T, V]
        return logits, session.backend_name
    finally:
        session.close()


def teacher_forced_logits(path: str | Path, token_ids: list[int], backend: str = "Auto") -> torch.Tensor:
    """[T, V] float32 logits of every position of `token_ids` through the model at `path` with expert backend
    `backend` (run_logits)."""
    return run_logits(path, token_ids, backend)[0]


def tokenize(path: str | Path, text: str) -> list[int]:
    """`text` as token ids with the tokenizer of the model at `path`."""
    from tessera.engine.tokenizer import Tokenizer

    ids = list(Tokenizer.from_path(Path(path)).encode(text))
    if not ids:
        from tessera.engine.errors import TesseraError

        raise TesseraError("--text", "is empty after tokenization")
    return ids


def compare(a: str | Path, b: str | Path, *, text: str | None = None, backend: str = "Auto") -> CompareReport:
    """Teacher-force `text` (tokenized by A's tokenizer) through A and B, both with expert backend `backend`, and
    compare their logits."""
    ids = tokenize(a, text if text is not None else SAMPLE_TEXT)
    logits_a, name = run_logits(a, ids, backend)
    logits_b, _ = run_logits(b, ids, backend)
    return replace(compare_logits(logits_a, logits_b), backend=name)


def format_report(r: CompareReport) -> str:
    head = f"backend {r.backend}  " if r.backend else ""
    return (
        f"{head}tokens {r.tokens}  max|dlogit| {r.max_abs_diff:.3g} ({r.rel_max_diff:.2e} of range {r.logit_range:.3g})"
        f"  top-1 agreement {r.top1_agreement:.3f}  mean KL {r.mean_kl:.3g} nats"
    )
