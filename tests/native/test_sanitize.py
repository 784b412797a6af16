"""The native C++ tests (every backend vs Reference, pool, headers, AMX emulator) under ASan+UBSan, via
scripts/sanitize_native.sh (a standalone CMake build of native/ into build/sanitize)."""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_native_cpp_tests_pass_under_asan_and_ubsan():
    if shutil.which("cmake") is None:
        pytest.skip("cmake not installed")
    r = subprocess.run([str(ROOT / "scripts" / "sanitize_native.sh")], cwd=ROOT, capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert "all passed" in r.stdout
    assert "ERROR: AddressSanitizer" not in r.stderr and "runtime error" not in r.stderr
