"""engine.heap: with the policy, a freed 32 MiB block is reused without page faults (on the main thread and on a
worker thread, as the app's engine runs); without it glibc maps it afresh each time (the control: what the policy
fixes); give_back returns freed pages to the OS; a session sets the policy on load and gives memory back after each
request, after loading and on close. Each heap measurement runs in a fresh interpreter, so no earlier test's
allocations or settings count."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tessera import engine
from tessera.engine import heap
from tessera.engine.sampling import SamplingParams

glibc_only = pytest.mark.skipif(heap._glibc() is None, reason="the policy is glibc's (Linux)")

# Allocates and frees a 32 MiB block (every page written) three times, on the main thread or a worker thread, and
# prints the minor page faults of the last two rounds; then frees a kept block and prints the RSS drop that
# give_back brings. glibc's own limit for its dynamic mmap threshold is 32 MiB, so this block is mapped afresh per
# allocation by default.
PROBE = textwrap.dedent("""
    import ctypes, resource, sys, threading
    from tessera.engine import heap
    keep, where = sys.argv[1] == "keep", sys.argv[2]
    if keep:
        assert heap.keep_freed_blocks() and heap.keep_freed_blocks()  # idempotent
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    N = 32 << 20
    faults = []
    def rounds():
        for i in range(3):
            f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            p = libc.malloc(N)
            ctypes.memset(p, 1, N)
            libc.free(p)
            if i:
                faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
    if where == "thread":
        t = threading.Thread(target=rounds)
        t.start()
        t.join()
    else:
        rounds()
    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096
    p = libc.malloc(N)
    ctypes.memset(p, 1, N)
    libc.free(p)
    before = rss()
    released = heap.give_back()
    print(max(faults), before - rss(), released)
""")


def probe(policy: str, where: str) -> tuple[int, int, bool]:
    r = subprocess.run([sys.executable, "-c", PROBE, policy, where], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    faults, dropped, released = r.stdout.split()
    return int(faults), int(dropped), released == "True"


@glibc_only
@pytest.mark.parametrize("where", ["main", "thread"])
def test_a_freed_block_is_reused_without_page_faults(where):
    pages = (32 << 20) // 4096
    faults, dropped, released = probe("keep", where)
    assert faults < pages // 100, f"{faults} faults for a block of {pages} pages that was freed and allocated again"
    # The kept block is released by give_back: most of its 32 MiB leaves the resident set.
    assert released and dropped > (24 << 20), f"RSS fell by {dropped} bytes after give_back"


@glibc_only
def test_without_the_policy_glibc_faults_the_block_in_again():
    faults, _, _ = probe("default", "main")
    assert faults > (32 << 20) // 4096 // 2  # what the policy removes; if glibc changes, this test says so


def test_other_c_libraries_are_left_alone(monkeypatch):
    monkeypatch.setattr(heap, "_glibc", lambda: None)
    monkeypatch.setattr(heap, "_kept", False)
    assert heap.keep_freed_blocks() is False and heap.give_back() is False


def test_a_session_keeps_blocks_and_gives_memory_back_after_each_request(tiny_gguf_model, monkeypatch):
    calls = []
    monkeypatch.setattr(heap, "keep_freed_blocks", lambda: calls.append("keep") or True)
    monkeypatch.setattr(heap, "give_back", lambda: calls.append("give_back") or True)
    session = engine.load(tiny_gguf_model, backend="Torch", threads=1)
    assert calls == ["keep", "give_back"]  # the policy before anything is allocated; what loading freed, after it
    ids = session.tokenizer.encode("Hello there")
    events = list(session.generate(ids, SamplingParams(temperature=0, max_tokens=3)))
    assert events and calls == ["keep"] + ["give_back"] * 2
    stream = session.generate(ids, SamplingParams(temperature=0, max_tokens=8))
    next(stream)
    stream.close()  # a request abandoned mid-way (a client gone, a cancelled chat) gives back too
    assert calls == ["keep"] + ["give_back"] * 3
    session.close()
    assert calls == ["keep"] + ["give_back"] * 4
