"""A machine that refuses namespaces, made here: `refuse_unshare` (a subprocess's preexec_fn) installs a
seccomp filter under which unshare(2) fails with EPERM, in the process and every one it starts, as Docker's
default seccomp profile makes it fail in a container without CAP_SYS_ADMIN. Nothing else changes: the
sandbox's own probe (kiln.eval.sandbox) meets the refusal a container would give it."""

from __future__ import annotations

import ctypes
import errno
import platform
import struct

# unshare's syscall number and the audit arch a filter must check it under (linux/audit.h)
SYS_UNSHARE = {"x86_64": 272, "aarch64": 97}.get(platform.machine())
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}.get(platform.machine())
PR_SET_SECCOMP, SECCOMP_MODE_FILTER, PR_SET_NO_NEW_PRIVS = 22, 2, 38
BPF_LD_W_ABS, BPF_JEQ_K, BPF_RET_K = 0x20, 0x15, 0x06  # ld [k]; jeq #k, jt, jf; ret #k
ALLOW, ERRNO = 0x7FFF0000, 0x00050000  # SECCOMP_RET_ALLOW; SECCOMP_RET_ERRNO | the errno


class _Program(ctypes.Structure):  # struct sock_fprog
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _op(code: int, jt: int, jf: int, k: int) -> bytes:  # struct sock_filter
    return struct.pack("HBBI", code, jt, jf, k)


# seccomp_data: nr at offset 0, arch at 4. Another arch's syscall numbers mean other calls: allowed.
FILTER = b"".join(
    [
        _op(BPF_LD_W_ABS, 0, 0, 4),
        _op(BPF_JEQ_K, 1, 0, AUDIT_ARCH or 0),
        _op(BPF_RET_K, 0, 0, ALLOW),
        _op(BPF_LD_W_ABS, 0, 0, 0),
        _op(BPF_JEQ_K, 0, 1, SYS_UNSHARE or 0),
        _op(BPF_RET_K, 0, 0, ERRNO | errno.EPERM),
        _op(BPF_RET_K, 0, 0, ALLOW),
    ]
)


def refuse_unshare() -> None:
    """From here on unshare(2) fails with EPERM in this process and its children (no_new_privs lets a
    process without CAP_SYS_ADMIN install the filter)."""
    libc = ctypes.CDLL(None, use_errno=True)
    code = ctypes.create_string_buffer(FILTER, len(FILTER))
    program = _Program(len(FILTER) // 8, ctypes.addressof(code))
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) or libc.prctl(
        PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(program), 0, 0
    ):
        raise OSError(ctypes.get_errno(), "seccomp: the filter refusing unshare was not installed")
