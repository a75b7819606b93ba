"""Resident memory of one process, split the way sleep/wake reports it (Linux `/proc`).

`read_process_memory(pid)` reads `/proc/PID/status` (VmRSS, RssAnon, RssFile, RssShmem)
and `/proc/PID/smaps_rollup` (Pss, Private_Clean + Private_Dirty = USS). RSS counts every
page the process maps, shared or not; PSS divides each shared page among the processes that
map it (so PSS of all processes sums to the memory they use together); USS counts only the
pages no other process maps (what ending the process gives back). A process that is gone,
or a system without `/proc`, reads as None.

    memory = read_process_memory(os.getpid())
    print(memory.rss_bytes, memory.uss_bytes)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

_STATUS_KEYS = {
    "VmRSS": "rss_bytes",
    "RssAnon": "anon_bytes",
    "RssFile": "file_bytes",
    "RssShmem": "shmem_bytes",
}


@dataclass(frozen=True)
class ProcessMemory:
    """One process's resident memory, in bytes."""

    pid: int
    rss_bytes: int = 0
    """Every resident page the process maps (anonymous + file-backed + shared memory)."""
    anon_bytes: int = 0
    """Anonymous pages: the heap, Python objects, tensors not backed by a file."""
    file_bytes: int = 0
    """File-backed pages: shared libraries and memory-mapped weights (reclaimable when clean)."""
    shmem_bytes: int = 0
    """Shared-memory pages (tmpfs, /dev/shm)."""
    pss_bytes: int = 0
    """Proportional set size: shared pages divided among the processes mapping them."""
    uss_bytes: int = 0
    """Unique set size: pages mapped by this process alone."""

    def as_dict(self) -> dict[str, int]:
        """Plain JSON-ready fields."""
        return asdict(self)


def read_process_memory(pid: int) -> ProcessMemory | None:
    """The memory of `pid`, or None when it is gone or `/proc` cannot be read."""
    try:
        status = _read_kib(f"/proc/{pid}/status", _STATUS_KEYS)
        rollup = _read_kib(
            f"/proc/{pid}/smaps_rollup",
            {"Pss": "pss_bytes", "Private_Clean": "clean", "Private_Dirty": "dirty"},
        )
    except OSError:
        return None
    uss = rollup.pop("clean", 0) + rollup.pop("dirty", 0)
    return ProcessMemory(pid=pid, uss_bytes=uss, **status, **rollup)


def rss_bytes(pid: int) -> int:
    """Resident bytes of `pid` (0 when it is gone)."""
    memory = read_process_memory(pid)
    return memory.rss_bytes if memory is not None else 0


def _read_kib(path: str, wanted: dict[str, str]) -> dict[str, int]:
    """Fields `name: N kB` of a /proc file, renamed by `wanted`, in bytes."""
    found: dict[str, int] = {}
    with open(path) as lines:
        for line in lines:
            name, _, rest = line.partition(":")
            if name in wanted:
                found[wanted[name]] = int(rest.split()[0]) * 1024
    return found
