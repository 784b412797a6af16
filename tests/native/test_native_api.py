"""engine.native's status API and the CPU probe: what the hardware wizard and the settings panel read."""

import pytest

import tessera.engine.backends as B
import tessera.engine.native as N
from tessera.engine.errors import BackendUnavailableError, TesseraError


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
    status = B.status()
    for name in B.names():
        assert name in status
        ok, reason = status[name]
        assert isinstance(ok, bool) and reason
    assert status["Reference"][0]
    name, reason = B.auto()
    assert status[name][0] and reason


def test_unavailable_backend_is_a_named_error_not_a_substitute():
    status = B.status()
    missing = [n for n in B.names()[1:] if not status[n][0]]
    if not missing:
        pytest.skip("every backend runs on this machine")
    with pytest.raises(BackendUnavailableError) as e:
        B.resolve(missing[0])
    assert e.value.subject == f"backend {missing[0]}"
    assert str(e.value) == f"backend {missing[0]}: {status[missing[0]][1]}"


def test_the_backend_list_is_the_native_registry_plus_auto_and_torch():
    compiled = [b["name"] for b in B.compiled() if not b["emulated"]]
    assert B.names() == ("Auto", *compiled, "Torch")
    table = {b.name: b for b in B.table()}
    assert list(table) == list(B.names())
    assert all(b.description for b in table.values())
    assert table["AVX512Int8"].weights == "int8" and table["Reference"].weights == "as loaded"
    assert table["Auto"].reason.startswith(f"picks {B.auto()[0]}: ")
    assert B.resolve("Torch")[0] == "Torch" and B.resolve("Auto") == B.auto()
    with pytest.raises(TesseraError, match="use one of Auto, "):
        B.check_name("AVX1024", "--backend")


def test_a_backend_handle_is_looked_up_once_and_carries_its_registry_entry():
    from tessera.engine import _native

    ref = _native.backend("Reference")
    row = next(b for b in B.compiled() if b["name"] == "Reference")
    assert (ref.name, ref.available, ref.reason, ref.emulated, ref.weights, ref.description) == (
        row["name"], row["available"], row["reason"], row["emulated"], row["weights"], row["description"])
    with pytest.raises(ValueError, match="backend: no backend named AVX1024 is compiled in"):
        _native.backend("AVX1024")


def test_tuning_knobs_are_read_once_in_the_native_module():
    import os
    import subprocess
    import sys

    code = "import json, tessera.engine.native as N; print(json.dumps([N.tuning(), N.packing_knobs('AVX512Int8')]))"
    env = dict(os.environ, TESSERA_INT8_GROUP="30", TESSERA_SPIN_US="7", TESSERA_AMX_TILE_MIN_ROWS="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    import json

    knobs, packing = json.loads(out)
    assert knobs["int8_group"] == 32 and knobs["spin_us"] == 7 and knobs["amx_tile_min_rows"] == 0
    assert knobs["dense_native_max_tokens"] == 512 and knobs["dense_quant_max_tokens"] == 2048
    assert "invalid" not in knobs
    assert set(knobs["from_environment"]) >= {"TESSERA_INT8_GROUP", "TESSERA_SPIN_US", "TESSERA_AMX_TILE_MIN_ROWS"}
    assert "TESSERA_PF" not in knobs["from_environment"]
    assert packing == {"int8_group": 32}  # the knob that changes packed bytes, for the packed-weight cache key
    assert N.packing_knobs("AVX512") == {}


def test_unknown_backend_name():
    with pytest.raises(TesseraError) as e:
        B.resolve("AVX1024")
    assert "backend AVX1024" in str(e.value)


def test_amx_backends_say_why_when_cpu_lacks_amx():
    f = N.cpu_features()
    if f["flags"]["amx_int8"]:
        pytest.skip("this CPU has AMX")
    ok, reason = B.status()["AMXInt8"]
    assert not ok and reason


def test_read_bandwidth_and_peaks_are_measured():
    assert N.read_bandwidth(threads=1, seconds=0.05, buffer_mib=64) > 0.1  # GB/s
    f = N.cpu_features()["flags"]
    bf16 = N.peak_gflops("bf16_dot", threads=1, seconds=0.05)
    assert (bf16 > 1) == f["avx512_bf16"] and (bf16 == -1) == (not f["avx512_bf16"])
    assert N.peak_gflops("fp32_fma", threads=1, seconds=0.05) > 1
    with pytest.raises(ValueError, match="what: expected bf16_dot, int8_dot, fp32_fma, amx_bf16 or amx_int8"):
        N.peak_gflops("int4", threads=1)


def test_pool_threads_default_to_physical_cores():
    assert N.make_pool().size == N.physical_cores()
    assert N.make_pool(3).size == 3
