"""Argument cases every dense kernel binding shares (bindings.cpp check_dense): the dense mat-vec, the bf16 GEMM and
the widening GEMM each must name the argument at fault. W, X, OUT are a valid call's operands (w [6, 10] bf16,
x [2, 10], out [2, 6]), for a test's own extra cases."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from tessera.engine import dense, native

W = torch.zeros(6, 10, dtype=torch.bfloat16)  # [N, K]
X, OUT = torch.zeros(2, 10), torch.zeros(2, 6)  # [T, K], [T, N]

COMMON_CASES = [
    ((W.float(), X, OUT), TypeError, "w: expected bfloat16 or float16, got float32"),
    ((W, X.double(), OUT), TypeError, "x: expected float32"),
    ((W, X, OUT.half()), TypeError, "out: expected float32"),
    ((W, torch.zeros(2, 11), OUT), ValueError, r"x: expected shape \[\*, 10\], got \[2, 11\]"),
    ((W, X, torch.zeros(3, 6)), ValueError, r"out: expected shape \[2, 6\], got \[3, 6\]"),
    ((W, torch.zeros(0, 10), torch.zeros(0, 6)), ValueError, "x: needs at least one row"),
    ((torch.zeros(10, 6, dtype=torch.bfloat16).T, X, OUT), ValueError, "w: must be C-contiguous"),
]


def check_argument_errors(fn, extra=()) -> None:
    """fn(w, x, out, pool) raises the named error for every common case and every (args, exc, msg) in extra."""
    pool = native.make_pool(1)
    for args, exc, msg in [*COMMON_CASES, *extra]:
        with pytest.raises(exc, match=msg):
            fn(*args, pool)


def run_capped(script: str, cap: str) -> list[str]:
    """The words a fresh interpreter prints running `script` (dedented) under TESSERA_MAX_ISA=cap: the kernels'
    availability is decided once per process. Fails the test, with its stderr, where the script does."""
    env = dict(os.environ, TESSERA_MAX_ISA=cap)
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


def capped_kernel_script(kernel: str, flag: str, says: str) -> str:
    """A script for run_capped: native.<kernel> is unavailable (<kernel>_available() and dense.<flag> are False), a
    call raises RuntimeError saying `says`, and a bf16 Linear still computes x @ w.T over 40 tokens; prints "ok"."""
    return f"""
        import torch
        from tessera.engine import dense, native
        assert not native.{kernel}_available() and not dense.{flag}
        w = torch.randn(4, 8).to(torch.bfloat16)
        try:
            native.{kernel}(w, torch.zeros(2, 8), torch.zeros(2, 4), native.make_pool(1))
        except RuntimeError as e:
            assert {says!r} in str(e), e
        else:
            raise AssertionError("no error")
        lin = dense.Linear(w, "cpu", "q_proj")
        x = torch.randn(40, 8)
        torch.testing.assert_close(lin(x), x @ w.float().T, rtol=1e-5, atol=1e-5)
        print("ok")
    """


def check_linear_threshold(monkeypatch, kernel: str, w: torch.Tensor, check, seed: int) -> list[int]:
    """A dense.Linear on w [N, 70] at 1, GEMM_MIN_TOKENS - 1, GEMM_MIN_TOKENS and NATIVE_MAX_TOKENS + 3 tokens, with
    native.<kernel> counted: from the threshold on it runs and its output passes check(y, w, x); below it the exact
    mat-vec answers. Returns the token counts the kernel saw (the caller may go on using the Linear's kernel)."""
    calls: list[int] = []
    real = getattr(native, kernel)
    monkeypatch.setattr(native, kernel, lambda *a: (calls.append(a[1].shape[0]), real(*a)))
    g = torch.Generator().manual_seed(seed)
    lin = dense.Linear(w, "cpu", "q_proj")
    for T in (1, dense.GEMM_MIN_TOKENS - 1, dense.GEMM_MIN_TOKENS, dense.NATIVE_MAX_TOKENS + 3):
        x = torch.randn(T, w.shape[1], generator=g)
        y = lin(x)
        if T >= dense.GEMM_MIN_TOKENS:
            check(y, w, x)
        else:  # the exact mat-vec
            torch.testing.assert_close(y, x @ w.float().T, rtol=1e-5, atol=1e-5)
    assert calls == [dense.GEMM_MIN_TOKENS, dense.NATIVE_MAX_TOKENS + 3]
    return calls
