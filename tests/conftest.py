"""Shared pytest fixtures. Keep each fixture small and documented; parts add theirs with surgical edits."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import pytest

# The suite never reads or writes the user's cache folder (packed copies, scale-check records, tuning records): every
# default folder (platformdirs' user cache dir) is under a throw-away XDG_CACHE_HOME, which child processes inherit,
# and the user's own folder overrides are dropped, so a test that moves XDG_CACHE_HOME moves every folder with it.
# Kernel tuning never calibrates on a load.
_TEST_CACHE = tempfile.mkdtemp(prefix="tessera-cache-tests-")
atexit.register(shutil.rmtree, _TEST_CACHE, ignore_errors=True)
os.environ["XDG_CACHE_HOME"] = _TEST_CACHE
for _override in ("TESSERA_PACK_CACHE_DIR", "TESSERA_TUNE_DIR"):
    os.environ.pop(_override, None)
os.environ.setdefault("TESSERA_TUNE_ON_LOAD", "0")


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
