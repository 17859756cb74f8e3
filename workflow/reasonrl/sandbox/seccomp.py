"""The seccomp filter of the sandbox: a classic-BPF program that bubblewrap installs (--seccomp)
right before it executes the sandboxed command.

It refuses, with EPERM, the system calls a Python program has no use for and that widen the
kernel surface an escape would go through: new namespaces (unshare, setns, clone with
CLONE_NEW*), mounts, ptrace and cross-process memory access, kernel keyrings, bpf, perf,
userfaultfd, io_uring, modules, kexec, reboot, swap, clock setting, POSIX message queues
(they outlive their program in the ipc namespace that a zygote's programs share, and cannot be
listed there without a mount), and sockets other than
AF_UNIX/AF_INET/AF_INET6 (no netlink, no raw packets). clone3 answers ENOSYS, so that the C
library falls back to clone, whose flags a filter can read. A call from another ABI
(x32, i386) kills the process: its numbers would bypass the table.

Built by hand (no libseccomp binding ships with Python); only x86_64 has a table, so
`filter_bytes()` is None elsewhere and the sandbox runs without the filter.
"""

from __future__ import annotations

import errno
import platform
import struct

AUDIT_ARCH_X86_64 = 0xC000003E
X32_SYSCALL_BIT = 0x40000000

# struct seccomp_data: int nr; u32 arch; u64 instruction_pointer; u64 args[6]
_NR_OFFSET, _ARCH_OFFSET, _ARG0_LOW, _ARG1_LOW = 0, 4, 16, 24

_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JGE_K = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_JSET_K = 0x45  # BPF_JMP | BPF_JSET | BPF_K
_RET_K = 0x06  # BPF_RET | BPF_K

RET_ALLOW = 0x7FFF0000
RET_KILL_PROCESS = 0x80000000
RET_ERRNO = 0x00050000

# x86_64 numbers of the calls refused with EPERM.
DENIED_X86_64 = {
    "ptrace": 101,
    "syslog": 103,
    "uselib": 134,
    "personality": 135,
    "vhangup": 153,
    "pivot_root": 155,
    "_sysctl": 156,
    "adjtimex": 159,
    "chroot": 161,
    "acct": 163,
    "settimeofday": 164,
    "mount": 165,
    "umount2": 166,
    "swapon": 167,
    "swapoff": 168,
    "reboot": 169,
    "sethostname": 170,
    "setdomainname": 171,
    "iopl": 172,
    "ioperm": 173,
    "create_module": 174,
    "init_module": 175,
    "delete_module": 176,
    "get_kernel_syms": 177,
    "query_module": 178,
    "quotactl": 179,
    "nfsservctl": 180,
    "lookup_dcookie": 212,
    "clock_settime": 227,
    "mq_open": 240,
    "kexec_load": 246,
    "add_key": 248,
    "request_key": 249,
    "keyctl": 250,
    "unshare": 272,
    "move_pages": 279,
    "perf_event_open": 298,
    "name_to_handle_at": 303,
    "open_by_handle_at": 304,
    "clock_adjtime": 305,
    "setns": 308,
    "process_vm_readv": 310,
    "process_vm_writev": 311,
    "kcmp": 312,
    "finit_module": 313,
    "kexec_file_load": 320,
    "bpf": 321,
    "userfaultfd": 323,
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "fspick": 433,
    "pidfd_getfd": 438,
    "mount_setattr": 442,
}
CLONE_X86_64, CLONE3_X86_64, SOCKET_X86_64, IOCTL_X86_64 = 56, 435, 41, 16
# CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET | NEWTIME
CLONE_NEW_NAMESPACES = (
    0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000 | 0x80
)
ALLOWED_SOCKET_FAMILIES = (1, 2, 10)  # AF_UNIX, AF_INET, AF_INET6
TIOCSTI = 0x5412  # pushes bytes into a terminal's input: a classic escape through a shared tty


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def _deny(err: int) -> bytes:
    return _insn(_RET_K, RET_ERRNO | err)


def _if_arg_in(syscall: int, offset: int, values: tuple[int, ...], otherwise: int) -> list[bytes]:
    """`syscall` returns -otherwise unless the 32-bit argument at `offset` is in `values`."""
    checks = [_insn(_JEQ_K, value, jt=len(values) - i) for i, value in enumerate(values)]
    return [
        _insn(_JEQ_K, syscall, jf=len(checks) + 3),
        _insn(_LD_W_ABS, offset),
        *checks,
        _deny(otherwise),
        _insn(_RET_K, RET_ALLOW),
    ]


def _if_arg_is(syscall: int, offset: int, value: int, err: int) -> list[bytes]:
    """`syscall` returns -err when the 32-bit argument at `offset` equals `value`."""
    return [
        _insn(_JEQ_K, syscall, jf=4),
        _insn(_LD_W_ABS, offset),
        _insn(_JEQ_K, value, jf=1),
        _deny(err),
        _insn(_RET_K, RET_ALLOW),
    ]


def _if_flags_set(syscall: int, offset: int, mask: int, err: int) -> list[bytes]:
    """`syscall` returns -err when the 32-bit argument at `offset` has any bit of `mask`."""
    return [
        _insn(_JEQ_K, syscall, jf=4),
        _insn(_LD_W_ABS, offset),
        _insn(_JSET_K, mask, jf=1),
        _deny(err),
        _insn(_RET_K, RET_ALLOW),
    ]


def x86_64_filter() -> bytes:
    """The filter program for x86_64, as the bytes of a struct sock_filter array."""
    program = [
        _insn(_LD_W_ABS, _ARCH_OFFSET),
        _insn(_JEQ_K, AUDIT_ARCH_X86_64, jt=1),
        _insn(_RET_K, RET_KILL_PROCESS),
        _insn(_LD_W_ABS, _NR_OFFSET),
        _insn(_JGE_K, X32_SYSCALL_BIT, jf=1),
        _insn(_RET_K, RET_KILL_PROCESS),
    ]
    for number in sorted(DENIED_X86_64.values()):
        program += [_insn(_JEQ_K, number, jf=1), _deny(errno.EPERM)]
    program += [_insn(_JEQ_K, CLONE3_X86_64, jf=1), _deny(errno.ENOSYS)]
    # Each block below ends in a return, so the accumulator it loads never leaks out of it.
    program += _if_flags_set(CLONE_X86_64, _ARG0_LOW, CLONE_NEW_NAMESPACES, errno.EPERM)
    program += _if_arg_in(SOCKET_X86_64, _ARG0_LOW, ALLOWED_SOCKET_FAMILIES, errno.EAFNOSUPPORT)
    program += _if_arg_is(IOCTL_X86_64, _ARG1_LOW, TIOCSTI, errno.EPERM)
    program.append(_insn(_RET_K, RET_ALLOW))
    return b"".join(program)


def filter_bytes() -> bytes | None:
    """The filter for this machine's architecture, or None where we have no syscall table."""
    return x86_64_filter() if platform.machine() == "x86_64" else None
