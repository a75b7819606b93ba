"""A job user's attempt gets a /dev/shm and SysV IPC of its own, gone when it ends.

/dev/shm is a tmpfs every user shares, and SysV shared memory is the host's: pages a job
leaves there outlive it, cannot be swapped (attempts run with `memory.swap.max` 0) and
stay charged to the jobs' cgroup, so one tenant could fill them and make the jobs' memory
limit kill another tenant's ranks; a segment made 0666 is a channel to every other
tenant. Here a job user's process (cold, or the warm one waiting for its attempt) starts,
as root and before the user switch, in new mount and IPC namespaces, with a fresh tmpfs
mounted on /dev/shm: what the attempt puts there, or in SysV IPC (POSIX message queues
too), is charged to the attempt's own memory limit and freed with its last process.
Everything one attempt runs (its launcher, ranks, standby, persister) shares them.

    prefix = private_prefix()            # [] where namespaces cannot be had here
    argv = [*prefix, *setpriv_argv, *command]

`available()` tries it once (`unshare` needs CAP_SYS_ADMIN: a root server; a container
without it cannot): where it fails, jobs start as before and the server logs one line.
A mount that fails inside the new namespace leaves the host's /dev/shm (the IPC
namespace stays private): a job is never refused for it.
"""

from __future__ import annotations

import functools
import shutil
import subprocess

MOUNT_SHM = 'mount -t tmpfs -o mode=1777,nosuid,nodev argosy-shm /dev/shm 2>/dev/null; exec "$@"'
"""Run as root in the new namespaces: a fresh tmpfs on /dev/shm, then the job's command."""


def private_prefix() -> list[str]:
    """The command prefix that starts what follows in private mount and IPC namespaces
    with its own /dev/shm; empty where that cannot be had (`available`)."""
    command = _in_namespaces(MOUNT_SHM)
    return [*command, "argosy-private-shm"] if command and available() else []


@functools.cache
def available() -> bool:
    """Whether this process may start a command in private mount and IPC namespaces with
    its own /dev/shm (tried once: `unshare` as it will be used, then a look at the mount)."""
    mounted = "grep -q '^argosy-shm /dev/shm ' /proc/self/mounts"
    command = _in_namespaces(f"mount -t tmpfs argosy-shm /dev/shm && {mounted}")
    if command is None:
        return False
    try:
        return subprocess.run(command, capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _in_namespaces(script: str) -> list[str] | None:
    """`sh -c script` in new mount (private propagation) and IPC namespaces; None where
    there is no `unshare`."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return None
    return [unshare, "--mount", "--ipc", "--propagation", "private", "--", "sh", "-c", script]
