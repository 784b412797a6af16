"""No AVX code may leak out of the ISA files into functions a baseline caller can reach.

A file compiled with -mavx512f emits every inline function and template it instantiates from shared headers
(std::vector<float>::resize, tessera's inline helpers) as a weak copy that may use AVX-512; the linker keeps one copy
of each, and the Reference backend or the import-time registration then runs AVX-512 on a CPU without it (SIGILL: seen
on an AVX2-only machine). native/src/isa_target.h confines each file's ISA to its own code. This test compiles every
ISA file as the build does and checks with objdump that each global or weak function using ymm/zmm registers has an
ISA name (`avx2`, `avx512`, or a file-local kernel); a negative control compiles one file the old way and must fail.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "native" / "src"
ISA_FILES = ["probe_avx512.cpp", "probe_avx512_bf16.cpp", "probe_avx2.cpp", "probe_avx512_vnni.cpp",
             "dense_avx512.cpp", "dense_avx2.cpp",
             "moe_avx512.cpp", "moe_avx512_bf16.cpp", "moe_avx512_int8.cpp", "moe_avx2.cpp", "amx_vec_avx512.cpp",
             "quant_avx512_vnni.cpp", "quant_avx2.cpp", "quant_gemm_avx512.cpp", "quant_gemm_amx.cpp",
             "quant_gemm_avx2.cpp", "quant_gemm_avx_vnni.cpp",
             "attention_avx512.cpp", "attention_avx512_bf16.cpp", "attention_q8_avx512_vnni.cpp", "attention_avx2.cpp",
             "attention_q8_avx2.cpp"]
ISA_NAME = re.compile(r"avx2|avx512|AVX2|AVX512|V256|V512")
# Functions of an ISA file that run on every CPU: the backend check, the AMX vector-table getter, static constructors.
EVERY_CPU = re.compile(r"::supported\(|vec_avx512(_bf16)?\(\)|_GLOBAL__sub_I|__static_initialization")
AVX_REGISTER = re.compile(r"%[yz]mm\d")

pytestmark = pytest.mark.skipif(shutil.which("g++") is None or shutil.which("objdump") is None
                                or shutil.which("nm") is None, reason="needs g++, objdump and nm (binutils)")


def _compile(src: Path, out: Path, flags: list[str]) -> Path:
    cmd = ["g++", "-std=c++17", *flags, "-I", str(ROOT / "native" / "include"), "-I", str(SRC), "-c", str(src),
           "-o", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return out


def _leaks(obj: Path) -> list[str]:
    """Functions of `obj` that use ymm/zmm registers but may run on a CPU without them: global or weak ones without an
    ISA name (a baseline caller may get this copy), and the ones every CPU runs (EVERY_CPU)."""
    exported = set()
    for line in subprocess.run(["nm", "-C", "--defined-only", str(obj)], capture_output=True, text=True,
                               check=True).stdout.splitlines():
        parts = line.split(" ", 2)
        if len(parts) == 3 and parts[1] in ("T", "W"):
            exported.add(parts[2])
    users, fn = set(), None
    for line in subprocess.run(["objdump", "-d", "-C", "--no-show-raw-insn", str(obj)], capture_output=True,
                               text=True, check=True).stdout.splitlines():
        m = re.match(r"^[0-9a-f]+ <(.*)>:$", line)
        if m:
            fn = m.group(1)
        elif fn is not None and AVX_REGISTER.search(line):
            users.add(fn)
    return sorted(f for f in users if (f in exported and not ISA_NAME.search(f)) or EVERY_CPU.search(f))


@pytest.mark.parametrize("opt", [["-O3"], ["-O1", "-fsanitize=address,undefined"]], ids=["O3", "O1-sanitize"])
@pytest.mark.parametrize("name", ISA_FILES)
def test_isa_file_exports_no_avx_outside_its_own_names(tmp_path, name, opt):
    obj = _compile(SRC / name, tmp_path / (name + ".o"), [*opt, "-ffp-contract=off"])
    assert _leaks(obj) == [], f"{name}: shared functions compiled with AVX registers"


def test_negative_control_whole_file_flags_leak(tmp_path):
    """Compiled the old way (AVX-512 flags for the whole file), as the sanitizer build was when an AVX2-only machine
    died of SIGILL in AVX512Int8's supported(): the check must see both that and std::vector<float>'s AVX-512 growth
    path, or it proves nothing."""
    obj = _compile(SRC / "moe_avx512_int8.cpp", tmp_path / "control.o",
                   ["-O1", "-fsanitize=address,undefined", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq",
                    "-mfma", "-mf16c", "-mavx512vnni"])
    leaks = _leaks(obj)
    assert any(f.startswith("std::vector<float") for f in leaks), leaks
    assert any("::supported(" in f for f in leaks), leaks
