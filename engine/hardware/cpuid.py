"""CPUID, XGETBV and the AMX permission request from Python, for when the native module is not built.

The native module (`engine.native.cpu_features()`) is the primary source; this is the fallback and is labelled as such
in the report. CPUID and XGETBV are executed as a few bytes of x86-64 machine code placed in an anonymous page that is
written first and only then made executable (never writable and executable at once). XGETBV is only executed when CPUID
says the OS enabled XSAVE (OSXSAVE), so it cannot fault. The AMX request is the documented `arch_prctl` system call.
Anything that is not x86-64 Linux, or a page that the OS refuses to make executable, gives `None`: the caller falls back
to /proc/cpuinfo and says so.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import mmap
import platform
import sys

# void cpuid(uint32 leaf /*edi*/, uint32 subleaf /*esi*/, uint32 out[4] /*rdx*/)
_CPUID_CODE = bytes([
    0x53,                    # push rbx            (callee-saved, cpuid clobbers it)
    0x89, 0xF8,              # mov eax, edi
    0x89, 0xF1,              # mov ecx, esi
    0x49, 0x89, 0xD0,        # mov r8, rdx
    0x0F, 0xA2,              # cpuid
    0x41, 0x89, 0x00,        # mov [r8], eax
    0x41, 0x89, 0x58, 0x04,  # mov [r8+4], ebx
    0x41, 0x89, 0x48, 0x08,  # mov [r8+8], ecx
    0x41, 0x89, 0x50, 0x0C,  # mov [r8+12], edx
    0x5B,                    # pop rbx
    0xC3,                    # ret
])
# uint64 xgetbv(uint32 index /*edi*/)
_XGETBV_CODE = bytes([
    0x89, 0xF9,              # mov ecx, edi
    0x0F, 0x01, 0xD0,        # xgetbv             -> edx:eax
    0x48, 0xC1, 0xE2, 0x20,  # shl rdx, 32
    0x48, 0x09, 0xD0,        # or rax, rdx
    0xC3,                    # ret
])

SYS_ARCH_PRCTL = 158
ARCH_GET_XCOMP_PERM = 0x1022
ARCH_REQ_XCOMP_PERM = 0x1023
XFEATURE_XTILEDATA = 18

# (leaf, subleaf, register index 0..3 = eax,ebx,ecx,edx, bit) per flag name (Intel SDM vol. 2A, CPUID).
FLAG_BITS: dict[str, tuple[int, int, int, int]] = {
    "sse4_2": (1, 0, 2, 20),
    "fma": (1, 0, 2, 12),
    "f16c": (1, 0, 2, 29),
    "avx": (1, 0, 2, 28),
    "avx2": (7, 0, 1, 5),
    "avx512f": (7, 0, 1, 16),
    "avx512dq": (7, 0, 1, 17),
    "avx512cd": (7, 0, 1, 28),
    "avx512bw": (7, 0, 1, 30),
    "avx512vl": (7, 0, 1, 31),
    "avx512_vnni": (7, 0, 2, 11),
    "avx512_fp16": (7, 0, 3, 23),
    "amx_bf16": (7, 0, 3, 22),
    "amx_tile": (7, 0, 3, 24),
    "amx_int8": (7, 0, 3, 25),
    "avx_vnni": (7, 1, 0, 4),
    "avx512_bf16": (7, 1, 0, 5),
    "amx_fp16": (7, 1, 0, 21),
}
_OSXSAVE = (1, 0, 2, 27)


class _Code:
    """A function made of machine code in its own read+execute page."""

    def __init__(self, code: bytes, restype, argtypes):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
        libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        size = mmap.PAGESIZE
        addr = libc.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap failed")
        ctypes.memmove(addr, code, len(code))
        if libc.mprotect(addr, size, mmap.PROT_READ | mmap.PROT_EXEC) != 0:
            raise OSError(ctypes.get_errno(), "mprotect(PROT_EXEC) refused")
        self.addr = addr  # kept mapped for the life of the process: a few bytes, created once
        self.fn = ctypes.CFUNCTYPE(restype, *argtypes)(addr)


_cpuid_fn = None
_xgetbv_fn = None


def supported() -> bool:
    return sys.platform.startswith("linux") and platform.machine().lower() in ("x86_64", "amd64")


def cpuid(leaf: int, subleaf: int = 0) -> tuple[int, int, int, int]:
    """(eax, ebx, ecx, edx) of CPUID(leaf, subleaf). Raises OSError where machine code cannot be run."""
    global _cpuid_fn
    if not supported():
        raise OSError(errno.ENOSYS, f"CPUID from Python needs x86-64 Linux, this is {sys.platform}/{platform.machine()}")
    if _cpuid_fn is None:
        _cpuid_fn = _Code(_CPUID_CODE, None, [ctypes.c_uint32, ctypes.c_uint32, ctypes.POINTER(ctypes.c_uint32)])
    out = (ctypes.c_uint32 * 4)()
    _cpuid_fn.fn(leaf, subleaf, out)
    return out[0], out[1], out[2], out[3]


def _bit(leaf: int, subleaf: int, reg: int, bit: int, max_leaf: int) -> bool:
    if leaf > max_leaf:
        return False
    if leaf == 7 and subleaf > cpuid(7, 0)[0]:
        return False
    return bool((cpuid(leaf, subleaf)[reg] >> bit) & 1)


def read_flags() -> tuple[dict[str, bool], int | None]:
    """CPUID feature flags and XCR0 (None when the OS did not enable XSAVE)."""
    global _xgetbv_fn
    max_leaf = cpuid(0, 0)[0]
    flags = {name: _bit(*bits, max_leaf) for name, bits in FLAG_BITS.items()}
    xcr0 = None
    if _bit(*_OSXSAVE, max_leaf):
        if _xgetbv_fn is None:
            _xgetbv_fn = _Code(_XGETBV_CODE, ctypes.c_uint64, [ctypes.c_uint32])
        xcr0 = int(_xgetbv_fn.fn(0))
    return flags, xcr0


def brand_string() -> str:
    """The CPU brand string from CPUID leaves 0x80000002..4 ('' when absent)."""
    if cpuid(0x80000000)[0] < 0x80000004:
        return ""
    raw = b"".join(r.to_bytes(4, "little") for leaf in (0x80000002, 0x80000003, 0x80000004) for r in cpuid(leaf))
    return raw.split(b"\0", 1)[0].decode("ascii", "replace").strip()


def request_amx_permission() -> tuple[bool, str]:
    """Ask Linux for AMX tile data state (arch_prctl ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA). (granted, why-not).

    Call only when CPUID reports amx_tile and XCR0 has bits 17/18: the answer then separates "kernel too old"
    (the arch_prctl option is unknown: kernel < 5.16) from "refused" (any other error).
    """
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    bits = ctypes.c_uint64(0)
    if libc.syscall(ctypes.c_long(SYS_ARCH_PRCTL), ctypes.c_long(ARCH_GET_XCOMP_PERM), ctypes.byref(bits)) != 0:
        err = ctypes.get_errno()
        if err == errno.EINVAL:
            return False, "kernel too old for AMX (arch_prctl ARCH_GET_XCOMP_PERM unknown; Linux >= 5.16 needed)"
        return False, f"arch_prctl(ARCH_GET_XCOMP_PERM) failed: {errno.errorcode.get(err, err)}"
    if bits.value & (1 << XFEATURE_XTILEDATA):
        return True, "XTILEDATA already granted to this process"
    rc = libc.syscall(ctypes.c_long(SYS_ARCH_PRCTL), ctypes.c_long(ARCH_REQ_XCOMP_PERM), ctypes.c_long(XFEATURE_XTILEDATA))
    if rc != 0:
        err = ctypes.get_errno()
        return False, f"kernel refused XTILEDATA permission (arch_prctl ARCH_REQ_XCOMP_PERM: {errno.errorcode.get(err, err)})"
    return True, "kernel granted XTILEDATA permission"
