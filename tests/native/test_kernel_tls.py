"""The attention kernels' loops never call __tls_get_addr.

The native module is loaded by dlopen, so every access to a thread_local is a call to __tls_get_addr. GCC propagated the
address of the attention kernels' thread_local scratch into their helpers (clones named ".constprop") and called
__tls_get_addr again inside their loops, once per row and key block in the q8_0 softmax: each call spills every vector
register and runs vzeroupper (measured on Zen 4: q8_0 decode attention 4-6 %, bf16 7-9 % slower). The kernels now see
their scratch through native/src/thread_scratch.h's opaque_ref. This test compiles each attention file as the module is
built (-O3 -fPIC) and checks with objdump that only the drivers, their merges and their pool tasks call __tls_get_addr,
each a few times (once per thread_local it names), and no helper does; a negative control compiles the old pattern and
must fail.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "native" / "src"
ATTENTION_FILES = ["attention_avx512.cpp", "attention_avx512_bf16.cpp", "attention_q8_avx512_vnni.cpp",
                   "attention_avx2.cpp", "attention_q8_avx2.cpp"]
# A driver (flash_attention / q8_flash_attention<K>) or the merge of its key ranges (merge_key_ranges16<K>,
# attention_flash.inc), or one of their pool tasks (a lambda of them): where the thread_locals are named, each at most a
# few times.
DRIVER = re.compile(r"flash_attention|merge_key_ranges")
MAX_CALLS_IN_DRIVER = 4

pytestmark = pytest.mark.skipif(shutil.which("g++") is None or shutil.which("objdump") is None,
                                reason="needs g++ and objdump (binutils)")


def _compile(src: Path, out: Path) -> Path:
    cmd = ["g++", "-std=c++17", "-O3", "-fPIC", "-ffp-contract=off", "-I", str(ROOT / "native" / "include"), "-I",
           str(SRC), "-c", str(src), "-o", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return out


def _tls_calls(obj: Path) -> dict[str, int]:
    """Calls of __tls_get_addr per function of `obj` (demangled names)."""
    calls: dict[str, int] = {}
    fn = None
    for line in subprocess.run(["objdump", "-d", "-C", "-r", "--no-show-raw-insn", str(obj)], capture_output=True,
                               text=True, check=True).stdout.splitlines():
        m = re.match(r"^[0-9a-f]+ <(.*)>:$", line)
        if m:
            fn = m.group(1)
        elif fn is not None and "__tls_get_addr" in line and "R_X86_64_PLT32" in line:
            calls[fn] = calls.get(fn, 0) + 1
    return calls


def _misplaced(calls: dict[str, int]) -> dict[str, int]:
    return {f: n for f, n in calls.items() if not DRIVER.search(f) or n > MAX_CALLS_IN_DRIVER}


@pytest.mark.parametrize("name", ATTENTION_FILES)
def test_attention_helpers_do_not_call_tls_get_addr(tmp_path, name):
    calls = _tls_calls(_compile(SRC / name, tmp_path / (name + ".o")))
    assert calls, f"{name}: no __tls_get_addr call at all: the objdump parsing no longer sees them"
    assert _misplaced(calls) == {}, f"{name}: thread_local accesses inside kernel helpers or loops"


NEGATIVE_CONTROL = r"""
#include <immintrin.h>
#include <vector>
#pragma GCC target("avx512f")
struct Scratch { std::vector<float> s, acc; };
__attribute__((noinline)) static void softmax(Scratch& w, long rows) {  // the kernels' helpers: too big to inline
  for (long r = 0; r < rows; ++r) {
    __m512 x = _mm512_loadu_ps(w.s.data() + r * 16);
    _mm512_storeu_ps(w.acc.data() + r * 16, _mm512_add_ps(x, _mm512_loadu_ps(w.acc.data() + r * 16)));
  }
}
void flash_attention(long rows, long blocks) {
  thread_local Scratch w;  // named directly, as the kernels did: GCC may clone softmax for this one object
  w.s.resize(size_t(rows) * 16);
  w.acc.resize(size_t(rows) * 16);
  for (long b = 0; b < blocks; ++b) softmax(w, rows);
}
"""


def test_negative_control_thread_local_named_in_the_loop(tmp_path):
    """The pattern the kernels had (a thread_local passed by name to a helper called in a loop) must be seen, or the
    check proves nothing."""
    src = tmp_path / "control.cpp"
    src.write_text(NEGATIVE_CONTROL)
    calls = _tls_calls(_compile(src, tmp_path / "control.o"))
    assert _misplaced(calls) != {}, calls
