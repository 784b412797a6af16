"""Tessera's engine: load a Qwen3-MoE model and generate. The public API (docs/INTERFACES.md):

    engine.load(path, *, backend="Auto", threads=None, context_length=None, progress=None, cancel=None) -> Session
    engine.inspect_model(path) -> ModelInfo     (headers only, no weights)

Imports are deferred so that `from tessera import engine` stays cheap (the CLI and the GUI import it before they need
torch).
"""

from __future__ import annotations

__all__ = ["load", "inspect_model"]


def load(path, **kwargs):
    """Load a GGUF file or Hugging Face folder into a `engine.session.Session` (see tessera/engine/session.py for
    arguments)."""
    from tessera.engine.session import load as _load

    return _load(path, **kwargs)


def inspect_model(path):
    """Read a model's headers only: architecture, sizes, tensor types and byte counts (tessera/engine/model_info.py)."""
    from tessera.engine.model_info import inspect_model as _inspect

    return _inspect(path)
