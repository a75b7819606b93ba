"""Release the trainer's idle OpenMP workers before the persister copies its snapshot.

After a parallel op (the optimizer step, the last kernel before `save`), the OpenMP
runtime keeps its idle workers spinning for milliseconds (libgomp: 300,000 spins unless
`OMP_WAIT_POLICY` says otherwise), on the cores the persister's copy needs: on a host whose
cores the trainer's intra-op threads fill, the snapshot's copy ran ~5-9% over the memcpy
floor beside them. OpenMP 5.0's `omp_pause_resource_all(omp_pause_soft)` ends the calling
thread's pool of workers at once; the next parallel region starts a new one (tens of
microseconds a thread).

Contract:
- `release_idle_workers()`: True when the process's OpenMP runtime released the calling
  thread's idle workers; False when there is nothing to release (one intra-op thread), no
  OpenMP runtime is loaded, it lacks the call, or it refused (inside a parallel region).
  Never raises, and touches no other thread's workers.
- `openmp_runtime()`: the path of the loaded OpenMP runtime (libgomp, libiomp, libomp), or
  None; found once in the process's memory map.
"""

from __future__ import annotations

import ctypes
import functools
import re
from collections.abc import Callable
from pathlib import Path

OMP_PAUSE_SOFT = 1
"""`omp_pause_soft`: the runtime ends its threads but keeps what it may reuse."""

_RUNTIME = re.compile(r"/lib(gomp|iomp5|omp)[^/]*\.so[^/]*$")


@functools.cache
def openmp_runtime() -> str | None:
    """The loaded OpenMP runtime's file, from /proc/self/maps (None elsewhere)."""
    try:
        lines = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split(maxsplit=5)  # address perms offset device inode [path]
        if len(fields) == 6 and _RUNTIME.search(fields[5]):
            return fields[5]
    return None


@functools.cache
def _pause_call() -> Callable[[int], int] | None:
    path = openmp_runtime()
    if path is None:
        return None
    try:
        call = ctypes.CDLL(path).omp_pause_resource_all
    except (OSError, AttributeError):
        return None
    call.argtypes, call.restype = [ctypes.c_int], ctypes.c_int
    return call


def release_idle_workers(intra_op_threads: int) -> bool:
    """End the calling thread's idle OpenMP workers (see module doc); `intra_op_threads`
    is the process's setting (`torch.get_num_threads()`): with one there are none."""
    if intra_op_threads <= 1:
        return False
    call = _pause_call()
    return call is not None and call(OMP_PAUSE_SOFT) == 0
