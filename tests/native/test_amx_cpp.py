"""Runs the AMX C++ tests (native/tests/test_amx.cpp: the tile emulator against the SDM definitions and this CPU's
FTZ/DAZ arithmetic, the vector half against its scalar twin, tile GEMM edges, a whole layer vs Reference) built with
ASan+UBSan, so they run with the Python suite even where nobody runs ctest."""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "native"
PORTABLE = ["amx_tile_emu", "amx_pack", "amx_vec_scalar", "moe_amx_emu", "moe_ref", "cpu", "pool", "dispatch"]
COMMON = ["-std=c++17", "-O0", "-g", "-ffp-contract=off", "-fsanitize=address,undefined",
          "-fno-sanitize-recover=undefined", f"-I{ROOT / 'include'}", f"-I{ROOT / 'src'}"]
AVX512 = ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512vnni", "-mfma"]


@pytest.mark.slow
def test_amx_cpp_suite_under_sanitizers(tmp_path):
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler on PATH")
    jobs = [(ROOT / f"src/{s}.cpp", []) for s in PORTABLE] + [(ROOT / "tests/test_amx.cpp", []),
                                                                 (ROOT / "src/amx_vec_avx512.cpp", AVX512)]
    objs, procs = [], []
    for src, flags in jobs:  # two compilers at a time (the 2-core budget)
        obj = tmp_path / (src.stem + ".o")
        objs.append(str(obj))
        procs.append(subprocess.Popen([cxx, *COMMON, *flags, "-c", str(src), "-o", str(obj)], stderr=subprocess.PIPE))
        if len(procs) == 2:
            for p in procs:
                assert p.wait() == 0, p.stderr.read().decode()
            procs = []
    for p in procs:
        assert p.wait() == 0, p.stderr.read().decode()
    exe = tmp_path / "test_amx"
    subprocess.run([cxx, *COMMON, *objs, "-o", str(exe), "-lpthread"], check=True, capture_output=True)
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "[FAIL]" not in run.stdout and run.stdout.count("[PASS]") >= 9, run.stdout
