"""engine.native's status API and the CPU probe: what the hardware wizard and the settings panel read."""

import pytest

import engine.native as N
from engine.errors import BackendUnavailableError, TesseraError


def test_cpu_features_has_flags_xcr0_and_amx_permission():
    f = N.cpu_features()
    for key in ("amx_tile", "amx_int8", "amx_bf16", "avx2", "avx512f", "avx512_vnni", "avx512_bf16"):
        assert isinstance(f["flags"][key], bool)
    assert f["physical_cores"] >= 1 and f["logical_cpus"] >= f["physical_cores"]
    assert isinstance(f["xcr0"], int)
    assert f["os_amx"] == bool(f["xcr0"] & (1 << 17) and f["xcr0"] & (1 << 18))
    if not f["flags"]["amx_tile"]:
        assert not f["amx_permitted"] and f["amx_reason"] == "CPU lacks amx_tile" and f["amx_perm_rc"] == -1
    assert f["amx_reason"]


def test_backend_status_lists_every_name_with_a_reason():
    status = N.backend_status()
    for name in N.BACKEND_NAMES:
        assert name in status
        ok, reason = status[name]
        assert isinstance(ok, bool) and reason
    assert status["Reference"][0]
    name, reason = N.auto_backend()
    assert status[name][0] and reason


def test_unavailable_backend_is_a_named_error_not_a_substitute():
    status = N.backend_status()
    missing = [n for n in N.BACKEND_NAMES[1:] if not status[n][0]]
    if not missing:
        pytest.skip("every backend runs on this machine")
    with pytest.raises(BackendUnavailableError) as e:
        N.resolve_backend(missing[0])
    assert e.value.subject == f"backend {missing[0]}"
    assert str(e.value) == f"backend {missing[0]}: {status[missing[0]][1]}"


def test_unknown_backend_name():
    with pytest.raises(TesseraError) as e:
        N.resolve_backend("AVX1024")
    assert "backend AVX1024" in str(e.value)


def test_amx_backends_say_why_when_cpu_lacks_amx():
    f = N.cpu_features()
    if f["flags"]["amx_int8"]:
        pytest.skip("this CPU has AMX")
    ok, reason = N.backend_status()["AMXInt8"]
    assert not ok and reason


def test_read_bandwidth_and_peaks_are_measured():
    assert N.read_bandwidth(threads=1, seconds=0.05, buffer_mib=64) > 0.1  # GB/s
    f = N.cpu_features()["flags"]
    bf16 = N.peak_gflops("bf16_dot", threads=1, seconds=0.05)
    assert (bf16 > 1) == f["avx512_bf16"] and (bf16 == -1) == (not f["avx512_bf16"])
    assert N.peak_gflops("fp32_fma", threads=1, seconds=0.05) > 1
    with pytest.raises(ValueError, match="what: expected bf16_dot or fp32_fma"):
        N.peak_gflops("int4", threads=1)


def test_pool_threads_default_to_physical_cores():
    assert N.make_pool().size == N.physical_cores()
    assert N.make_pool(3).size == 3
