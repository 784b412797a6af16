"""The one list of expert backends: which names a user may choose, whether each runs here and why, what it is, and
which one "Auto" picks.

Owned by the native layer: names, availability, reasons and descriptions come from the compiled registry
(native/src/dispatch.cpp) through `engine._native`; the only names added here are the two that are not kernels, Auto
and Torch. Settings, placement rules, the hardware check, the CLI and the app's worker all ask this module. It imports
no torch, so `--help` and the app's backend list cost nothing before a model loads.
"""

from __future__ import annotations

from dataclasses import dataclass

from tessera.engine import _native
from tessera.engine.errors import BackendUnavailableError, TesseraError

AUTO = "Auto"
TORCH = "Torch"
TORCH_DESCRIPTION = "pure-PyTorch experts: no native kernel, always available, the slowest"


@dataclass(frozen=True)
class Backend:
    """One choice of expert backend as a user sees it."""

    name: str
    available: bool
    reason: str  # why it is (un)available: "CPU lacks amx_int8", "capped by TESSERA_MAX_ISA=avx2", "picks AVX512: ..."
    description: str  # what it is, in one line
    weights: str = "as loaded"  # how it keeps the routed-expert weights: "int8", "bf16" or "as loaded"


def compiled() -> list[dict]:
    """Every backend compiled into the native module, highest priority first, including the emulated test-only ones:
    name, available, reason, emulated, isa_level, priority, weights, description."""
    return list(_native.backends())


def names() -> tuple[str, ...]:
    """The names a user may choose, in the order to offer them: Auto, the compiled kernels (best first), Torch.
    The emulated AMX backends are for tests and are not offered (resolve() still accepts them)."""
    return (AUTO, *(b["name"] for b in compiled() if not b["emulated"]), TORCH)


def available_names(include_emulated: bool = False) -> list[str]:
    """Compiled backends that run on this machine (best first)."""
    return [b["name"] for b in compiled() if b["available"] and (include_emulated or not b["emulated"])]


def auto() -> tuple[str, str]:
    """(name, reason) of the backend Auto picks: the best available kernel that is not emulated, else Torch."""
    picked = _native.auto_backend()
    if picked is None:
        return TORCH, "no native kernel runs on this CPU, so Auto uses the pure-PyTorch experts"
    return str(picked[0]), str(picked[1])


def table() -> list[Backend]:
    """Every name a user may choose, with availability, reason and description, in the order of names()."""
    picked, why = auto()
    rows = [Backend(AUTO, True, f"picks {picked}: {why}", "the best backend this CPU runs")]
    for b in compiled():
        if not b["emulated"]:
            rows.append(Backend(b["name"], bool(b["available"]), str(b["reason"]), str(b["description"]),
                                str(b["weights"])))
    rows.append(Backend(TORCH, True, TORCH_DESCRIPTION, TORCH_DESCRIPTION))  # one wording, as resolve() says it
    return rows


def status() -> dict[str, tuple[bool, str]]:
    """{name: (available, reason)} for every name a user may choose, in the order of names()."""
    return {b.name: (b.available, b.reason) for b in table()}


def resolve(name: str) -> tuple[str, str]:
    """The one place "Auto" is resolved: name -> (concrete backend, why). Never substitutes one backend for another:
    an unknown name raises TesseraError listing the choices, an unavailable one BackendUnavailableError saying why."""
    if name == AUTO:
        return auto()
    if name == TORCH:
        return TORCH, TORCH_DESCRIPTION
    known = {b["name"]: b for b in compiled()}
    if name not in known:
        raise TesseraError(f"backend {name}", f"unknown backend; choose one of {', '.join(names())}")
    b = known[name]
    if not b["available"]:
        raise BackendUnavailableError(f"backend {name}", str(b["reason"]))
    return name, str(b["reason"])


def check_name(name: str, where: str) -> None:
    """A named error (`where`: the flag, setting or rule) when `name` is not a backend a user may choose."""
    if name not in names():
        raise TesseraError(where, f"unknown backend {name!r}: use one of " + ", ".join(names()))
