"""Failures of the machine rather than of the input, said in a sentence: too little address space (`ulimit -v`) to
map PyTorch's libraries or allocate a tensor."""

from __future__ import annotations

import resource


def _limit_text() -> str:
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    return "" if soft == resource.RLIM_INFINITY else f" (ulimit -v is {soft // 1024} kB)"


def explain(e: BaseException) -> tuple[str, str] | None:
    """(subject, message) for an out-of-memory failure, else None."""
    text = str(e)
    if isinstance(e, MemoryError) or (
            isinstance(e, (ImportError, OSError, RuntimeError)) and (
                "failed to map segment" in text or "Cannot allocate memory" in text
                or "cannot allocate memory" in text.lower() or "DefaultCPUAllocator: can't allocate" in text)):
        return "memory", (f"not enough memory or address space for this{_limit_text()}; raise the limit or use a "
                          "smaller model or context")
    return None


MIN_ADDRESS_SPACE = 1 << 30  # PyTorch maps ~1 GB of libraries; each thread reserves its stack; below this it aborts


def address_space_problem() -> tuple[str, str] | None:
    """A `ulimit -v` too small to start PyTorch and its threads (glibc aborts without a message there), said first."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY and soft < MIN_ADDRESS_SPACE:
        return "memory", (f"ulimit -v is {soft // 1024} kB; Tessera needs at least {MIN_ADDRESS_SPACE >> 20} MiB of "
                          "address space (plus the model) to start: raise it with `ulimit -v unlimited`")
    return None
