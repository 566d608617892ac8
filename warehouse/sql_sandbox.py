"""The second wall around untrusted SQL: what the operating system lets a query's worker process do.

A SQL worker (:mod:`.sql_worker`) confines itself before it reads its first query, and
nothing it is later asked can undo it:

* **Landlock** (Linux 5.13+, unprivileged): the process and every thread it starts later
  may only read files beneath the folders it names (the warehouse's ``tables/`` for the
  API; everything for the CLI) and may not create, write, truncate, rename, link or
  remove any file or folder anywhere, except beneath a private scratch folder where
  one is named. With ABI 4+ it may not open TCP connections or listen; with ABI 6+ it
  may not signal processes outside its own sandbox (the server). This wall does not
  depend on DuckDB's settings or on the parse-tree check: a write those miss still
  fails with ``EACCES`` in the kernel.
* **Resource limits** (``setrlimit``): ``RLIMIT_DATA`` caps the memory it may map beyond
  its idle size (DuckDB then fails with its own out-of-memory error, and nothing else
  on the machine is touched); ``RLIMIT_FSIZE`` 0 (no file may grow, even one opened
  before); ``RLIMIT_CORE`` 0. ``RLIMIT_AS`` would count address space that DuckDB's
  allocator and thread stacks reserve but never touch (about 0.8 GB at 70 MB resident),
  so the data limit is the one that bounds what is resident.

Why Landlock: it needs no root, no second user, no mount namespace and no helper binary,
applies to the process and its future threads, cannot be lifted, and restricts exactly
by path. Where the kernel lacks it, :func:`landlock_abi` says 0; the API then refuses SQL
unless the operator opts out (docs/security.md).
"""

from __future__ import annotations

import ctypes
import os
import resource
import sys
from pathlib import Path

# Syscall numbers: the same on every architecture (added to the generic table in Linux 5.13).
_CREATE_RULESET, _ADD_RULE, _RESTRICT_SELF = 444, 445, 446
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38

# Filesystem access rights, by the ABI that introduced them.
EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
REMOVE_DIR, REMOVE_FILE, MAKE_CHAR, MAKE_DIR = 1 << 4, 1 << 5, 1 << 6, 1 << 7
MAKE_REG, MAKE_SOCK, MAKE_FIFO, MAKE_BLOCK, MAKE_SYM = 1 << 8, 1 << 9, 1 << 10, 1 << 11, 1 << 12
REFER, TRUNCATE, IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
_FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1, 5: (1 << 16) - 1}
_NET_BIND_TCP, _NET_CONNECT_TCP = 1 << 0, 1 << 1
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1 << 0, 1 << 1

#: Rights beneath a folder the process may read.
READ = READ_FILE | READ_DIR
#: Rights beneath its scratch folder: make, write and remove regular files and folders (no links, devices).
SCRATCH = READ | WRITE_FILE | MAKE_REG | MAKE_DIR | REMOVE_FILE | REMOVE_DIR | TRUNCATE


class SandboxError(OSError):
    """The sandbox could not be set up as asked."""


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def landlock_abi() -> int:
    """The Landlock ABI version this kernel offers; 0 where there is none (not Linux, too old, disabled)."""
    if not sys.platform.startswith("linux"):
        return 0
    try:
        abi = _libc().syscall(_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    except (OSError, AttributeError):
        return 0
    return max(int(abi), 0)


def restrict(read: list[Path], scratch: list[Path] | None = None) -> int:
    """Confine this process with Landlock: read beneath ``read``, write beneath ``scratch`` only, no TCP.

    Call it before any other thread starts (Landlock applies to the calling thread and
    the threads it starts later). Folders that do not exist are skipped.

    Returns:
        The Landlock ABI in force (0: the kernel has none, and nothing was restricted).

    Raises:
        SandboxError: Landlock is there but refused the rules.
    """
    abi = landlock_abi()
    if abi <= 0:
        return 0
    libc = _libc()
    handled_fs = _FS_BY_ABI.get(abi, _FS_BY_ABI[5])
    attr = _RulesetAttr(handled_fs, _NET_BIND_TCP | _NET_CONNECT_TCP if abi >= 4 else 0,
                        _SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL if abi >= 6 else 0)
    size = ctypes.sizeof(_RulesetAttr) if abi >= 6 else (16 if abi >= 4 else 8)
    ruleset = libc.syscall(_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        raise SandboxError(ctypes.get_errno(), f"landlock_create_ruleset: {os.strerror(ctypes.get_errno())}")
    try:
        for folders, access in ((read, READ), (scratch or [], SCRATCH)):
            for folder in folders:
                _allow(libc, ruleset, folder, access & handled_fs)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise SandboxError(ctypes.get_errno(), f"prctl(NO_NEW_PRIVS): {os.strerror(ctypes.get_errno())}")
        if libc.syscall(_RESTRICT_SELF, ruleset, ctypes.c_uint32(0)) != 0:
            raise SandboxError(ctypes.get_errno(), f"landlock_restrict_self: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(ruleset)
    return abi


def _allow(libc: ctypes.CDLL, ruleset: int, folder: Path, access: int) -> None:
    try:
        fd = os.open(folder, os.O_PATH | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        if not os.path.isdir(folder):
            access &= READ_FILE | WRITE_FILE | TRUNCATE | EXECUTE  # rights on a file itself
        rule = _PathBeneathAttr(access, fd)
        if libc.syscall(_ADD_RULE, ruleset, _RULE_PATH_BENEATH, ctypes.byref(rule), ctypes.c_uint32(0)) != 0:
            raise SandboxError(ctypes.get_errno(), f"landlock_add_rule {folder}: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(fd)


def runtime_paths() -> list[Path]:
    """What the interpreter and DuckDB read after the sandbox closes: modules, time zones, their own process.

    Nothing here holds data: the Python installation, time zone files, this process's own
    ``/proc`` entries, and the CPU and memory figures DuckDB sizes itself by.
    """
    found = {Path(sys.prefix), Path(sys.base_prefix), Path(sys.exec_prefix), Path(sys.base_exec_prefix),
             Path(__file__).resolve().parent, Path("/usr/share/zoneinfo"), Path("/etc/localtime"),
             Path(f"/proc/{os.getpid()}"), Path("/proc/meminfo"), Path("/proc/cpuinfo"), Path("/sys/fs/cgroup"),
             Path("/sys/devices/system/cpu")}
    found.update(Path(p) for p in sys.path if p and Path(p).is_absolute())
    return sorted(p for p in found if p.exists())


def limit_memory(extra_bytes: int) -> int:
    """Cap this process's data segment (heap and private mappings) at its current size plus ``extra_bytes``.

    Returns:
        The cap in bytes (0 where the platform cannot tell the current size: nothing was capped).
    """
    current = _data_bytes()
    if current <= 0:
        return 0
    cap = current + max(int(extra_bytes), 0)
    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_DATA, (cap, hard if hard != resource.RLIM_INFINITY else cap))
    return cap


def stack_bytes() -> int:
    """The size of a new thread's stack (glibc takes ``RLIMIT_STACK``; 8 MiB where unlimited)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_STACK)
    return 8 << 20 if soft == resource.RLIM_INFINITY or soft <= 0 else int(soft)


def no_files_grow() -> None:
    """No file may grow and no core file be written by this process (``RLIMIT_FSIZE``, ``RLIMIT_CORE`` 0)."""
    for limit in (resource.RLIMIT_FSIZE, resource.RLIMIT_CORE):
        resource.setrlimit(limit, (0, 0))


def _data_bytes() -> int:
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmData:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def threads() -> int:
    """How many threads this process has now (1 where the platform cannot tell)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


__all__ = ["SandboxError", "landlock_abi", "limit_memory", "no_files_grow", "restrict", "runtime_paths",
           "stack_bytes", "threads"]
