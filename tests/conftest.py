"""Shared pytest fixtures. Keep each fixture small and documented; parts add theirs with surgical edits."""

from __future__ import annotations

import os
import tempfile

import pytest

# Kernel tuning (tessera/engine/tuned.py): tests never calibrate on a load, and never read or write the user's records.
os.environ.setdefault("TESSERA_TUNE_ON_LOAD", "0")
os.environ.setdefault("TESSERA_TUNE_DIR", tempfile.mkdtemp(prefix="tessera-tune-tests-"))


@pytest.fixture(scope="session")
def tiny_hf_model(tmp_path_factory):
    """Path of a random tiny Qwen3-MoE HF folder (make-model preset tiny, f32, seed 0, sharded into ~3 safetensors files
    with model.safetensors.index.json). Same weights as `tiny_gguf_model`. Treat as read-only."""
    from tessera.engine.make_model import make_model

    return make_model(tmp_path_factory.mktemp("tiny-hf") / "model", fmt="hf", dtype="f32", seed=0,
                      max_shard_bytes=1_500_000)


@pytest.fixture(scope="session")
def tiny_gguf_model(tmp_path_factory):
    """Path of a random tiny Qwen3-MoE GGUF file (make-model preset tiny, f32, seed 0): the same weights, tokenizer and
    config as `tiny_hf_model`. Treat as read-only."""
    from tessera.engine.make_model import make_model

    return make_model(tmp_path_factory.mktemp("tiny-gguf") / "tiny.gguf", fmt="gguf", dtype="f32", seed=0)
