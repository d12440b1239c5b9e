"""The jail's seccomp filter, compiled once per host process and handed to bwrap as BPF bytes.

Compiling with libseccomp costs ~20 ms of CPU, so we build it once, export the raw BPF program and give
each new jail a fresh memfd holding it (``bwrap --seccomp FD``). The filter is a deny list on top of
bwrap's own (no new privileges, user namespace without capabilities): it removes the kernel surfaces
that a program judged on stdout never needs and that jail escapes tend to use.
"""
from __future__ import annotations

import errno
import functools
import os
import socket

from .types import SandboxUnavailable

# Denied with EPERM: debugging other processes, namespaces/mounts, kernel modules and keys, eBPF/perf,
# io_uring and userfaultfd (frequent exploit primitives), clocks and other host-wide state.
DENIED = (
    "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "kcmp",
    "mount", "umount2", "pivot_root", "chroot", "unshare", "setns", "move_mount", "open_tree",
    "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr",
    "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register",
    "keyctl", "add_key", "request_key", "init_module", "finit_module", "delete_module",
    "kexec_load", "kexec_file_load", "reboot", "swapon", "swapoff", "syslog", "acct", "quotactl",
    "open_by_handle_at", "name_to_handle_at", "fanotify_init", "lookup_dcookie", "personality",
    "iopl", "ioperm", "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "vhangup",
    "setdomainname", "sethostname",
    # SysV IPC and POSIX message queues outlive a process inside the jail's IPC namespace: denied, so no
    # run can leave data for the next run in the same warm jail.
    "shmget", "shmat", "shmctl", "shmdt", "msgget", "msgsnd", "msgrcv", "msgctl",
    "semget", "semop", "semctl", "semtimedop", "mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive",
    "mq_notify", "mq_getsetattr",
)
# clone() creating namespaces; clone3 passes flags in memory that seccomp cannot read, so it gets
# ENOSYS and glibc falls back to clone(), which we can inspect.
CLONE_NS_FLAGS = 0x00020000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000 | 0x02000000
TIOCSTI, TIOCLINUX = 0x5412, 0x541C  # terminal keystroke injection


class _Fd:
    """export_bpf only needs .fileno()."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def fileno(self) -> int:
        return self._fd


def _build() -> bytes:
    try:
        import pyseccomp as sc
    except ImportError as e:  # pragma: no cover - depends on the machine
        raise SandboxUnavailable("seccomp: PyPI package 'pyseccomp' (and Debian libseccomp2) is needed") from e
    try:
        f = sc.SyscallFilter(sc.ALLOW)
        eperm = sc.ERRNO(errno.EPERM)
        for name in DENIED:
            try:
                f.add_rule(eperm, name)
            except (ValueError, OSError):  # a syscall this kernel/arch does not have: nothing to deny
                pass
        f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
        f.add_rule(eperm, "clone", sc.Arg(0, sc.MASKED_EQ, CLONE_NS_FLAGS, CLONE_NS_FLAGS))
        for flag in (0x00020000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000, 0x02000000):
            f.add_rule(eperm, "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
        # ioctl's request is an int: compare the low 32 bits only, so high garbage bits cannot slip by.
        for req in (TIOCSTI, TIOCLINUX):
            f.add_rule(eperm, "ioctl", sc.Arg(1, sc.MASKED_EQ, 0xFFFFFFFF, req))
        # Only AF_UNIX sockets (socketpair between the program's own processes); no IP, netlink or raw.
        f.add_rule(sc.ERRNO(errno.EACCES), "socket", sc.Arg(0, sc.NE, socket.AF_UNIX))
        fd = os.memfd_create("rlvr-seccomp-export", os.MFD_CLOEXEC)
        try:
            f.export_bpf(_Fd(fd))
            size = os.lseek(fd, 0, os.SEEK_END)
            return os.pread(fd, size, 0)
        finally:
            os.close(fd)
    except SandboxUnavailable:
        raise
    except Exception as e:  # libseccomp missing or refusing the rules
        raise SandboxUnavailable(f"seccomp filter could not be built: {e}") from e


@functools.lru_cache(maxsize=1)
def bpf_program() -> bytes:
    """The raw BPF program (sock_filter array) for ``bwrap --seccomp``."""
    prog = _build()
    if not prog or len(prog) % 8:
        raise SandboxUnavailable(f"seccomp export produced {len(prog)} bytes, not a BPF program")
    return prog


def bpf_fd() -> int:
    """A new memfd positioned at 0 holding the BPF program; the caller passes it to bwrap and closes it."""
    fd = os.memfd_create("rlvr-seccomp", 0)  # not CLOEXEC: bwrap must inherit it
    os.write(fd, bpf_program())
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
