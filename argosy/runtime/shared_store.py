"""Every node of a multi-node launch proves it sees the job's one checkpoint store.

    gang = gang_id(os.environ, master_addr, master_port)
    write_probe(store, gang, node_rank)                 # every node, before its ranks start
    if node_rank == 0:
        wait_for_nodes(store, gang, nnodes, timeout_s)  # raises StoreNotSharedError

Each node's launcher writes `<store>/.nodes/<gang>/<node rank>`; node rank 0 waits until
it sees every node's file, then removes the folder. A store that is not shared (each
node its own local directory) would let every node write its own half of each step, and
no commit would ever complete: such a launch fails at once, naming the node it cannot
see and what to do. The gang is the attempt (ARGOSY_GANG_ID, set by the Ray executor),
else the rendezvous address and port that all nodes of the launch were given.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import time
from collections.abc import Mapping
from pathlib import Path

from argosy.core.errors import ArgosyError

ENV_GANG = "ARGOSY_GANG_ID"
PROBES = ".nodes"


class StoreNotSharedError(ArgosyError):
    """Node rank 0 cannot see another node's probe in the checkpoint store."""


def gang_id(env: Mapping[str, str], master_addr: str, master_port: int | None) -> str:
    """What names this launch's probes: the same on every node of one attempt."""
    raw = env.get(ENV_GANG) or f"{master_addr}-{master_port or 'auto'}"
    return re.sub(r"[^A-Za-z0-9._-]", "_", raw)


def write_probe(store: Path, gang: str, node_rank: int) -> Path:
    """Write this node's probe (host and pid inside, for whoever looks)."""
    folder = store / PROBES / gang
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / str(node_rank)
    tmp = folder / f".{node_rank}.{os.getpid()}.tmp"
    tmp.write_text(f"{socket.gethostname()} {os.getpid()} {time.time():.3f}\n")
    os.replace(tmp, path)
    return path


def wait_for_nodes(
    store: Path, gang: str, nnodes: int, timeout_s: float, poll_s: float = 0.1
) -> None:
    """Node rank 0: wait (at most `timeout_s`) until every node's probe is in `store`."""
    folder = store / PROBES / gang
    deadline = time.monotonic() + timeout_s
    while True:
        missing = [n for n in range(1, nnodes) if not (folder / str(n)).exists()]
        if not missing:
            shutil.rmtree(folder, ignore_errors=True)  # every node wrote: nothing more comes
            return
        if time.monotonic() >= deadline:
            raise StoreNotSharedError(_message(store, missing, timeout_s))
        time.sleep(poll_s)


def _message(store: Path, missing: list[int], timeout_s: float) -> str:
    nodes = ", ".join(str(n) for n in missing)
    which = f"node {nodes}'s probe" if len(missing) == 1 else f"the probes of nodes {nodes}"
    return (
        f"node rank 0 cannot see {which} in {store} after {timeout_s:g} s: every node must "
        "mount the same checkpoint store (a shared filesystem); set --ckpt-dir to a path on "
        "it (for the Ray executor: the server's runs directory on shared storage), or raise "
        "runtime.store_probe_timeout_s if the other nodes start late"
    )
