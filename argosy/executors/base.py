"""The executor contract and the values that cross it.

`LaunchRequest` is one attempt of one job, already placed: which nodes and how many
devices on each (or, with `command`, one process of a service replica). `AttemptExit`
is what came of it: an exit code from `argosy launch`
(0 succeeded; 1 or 2 the job itself failed) or `lost=True` when the attempt died of
something outside the job (its process killed, its node gone, the executor restarted
without it), which the server answers with a new attempt from the job's checkpoint.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class NodeInfo:
    """One node an executor can place work on: `devices` of one chip type."""

    name: str
    chip: str
    devices: int
    address: str = ""


@dataclass(frozen=True)
class LaunchRequest:
    """One attempt of a job, placed on `nodes` (name -> devices on it)."""

    job_id: str
    attempt: int
    script: str
    args: tuple[str, ...]
    nproc_per_node: int
    run_dir: Path
    nodes: dict[str, int]
    chip: str
    workdir: str | None = None
    max_restarts: int | None = None
    env: dict[str, str] = field(default_factory=dict)
    inject: tuple[str, ...] = ()
    """`argosy launch --inject` values for this attempt."""
    command: tuple[str, ...] = ()
    """A command to run instead of `argosy launch` (a service replica's `argosy serve`);
    single node, one process."""
    queue: str | None = None
    """The job's queue: which user it runs as, where the executor isolates queues."""


@dataclass(frozen=True)
class AttemptExit:
    """How one attempt ended."""

    job_id: str
    attempt: int
    exit_code: int | None
    lost: bool
    reason: str
    lost_node_ranks: tuple[int, ...] = ()
    """The node ranks whose node was lost or hung (died, dead by Ray, or silent), when the
    executor knows them: the other node ranks' crash and hang evidence of this attempt
    followed from that loss and says nothing of their own nodes."""


def describe_exit(code: int | None) -> str:
    """Human words for an `argosy launch` exit status as a shell reports it."""
    if code is None:
        return "the attempt's process vanished without an exit status"
    if code == 0:
        return "exited 0"
    if code > 128:
        try:
            name = signal.Signals(code - 128).name
        except ValueError:
            name = f"signal {code - 128}"
        return f"the launcher was killed by {name} (exit {code})"
    return f"the launcher exited {code}"


def is_lost(code: int | None) -> bool:
    """Whether an exit status means the attempt died of something outside the job."""
    return code is None or code > 128


@runtime_checkable
class Executor(Protocol):
    """What the server needs from an executor."""

    name: str
    lends_sleeping: bool
    """Whether a sleeping attempt's devices can go to another attempt meanwhile (`lend`):
    where they cannot (Ray keeps an actor's resources for its life), a tidal replica
    yields its device by stopping, and a reclaim starts it afresh."""

    def inventory(self) -> list[NodeInfo]:
        """Nodes and devices this executor can place work on."""
        ...

    def start(self, request: LaunchRequest) -> None:
        """Start the attempt; returns once its processes are on their way."""
        ...

    def stop(self, job_id: str) -> None:
        """Ask the job's running attempt to stop (it is reported by `poll` once gone)."""
        ...

    def poll(self) -> list[AttemptExit]:
        """Attempts that ended since the last call."""
        ...

    def adopt(self, job_id: str, attempt: int, run_dir: Path) -> AttemptExit | None:
        """After a server restart: track the attempt and return None if it still runs,
        else how it ended."""
        ...

    def devices_busy(self, nodes: dict[str, int]) -> bool:
        """Whether an attempt placed on `nodes` would not find that many free devices
        there now: an attempt stopped to make room for it still holds them until it is
        gone (the server then places it again at a later cycle)."""
        ...

    def devices_of(self, job_id: str) -> str:
        """Which devices the job's running attempt sees, as its environment names them
        (`CUDA_VISIBLE_DEVICES=4,5,6,7`), or "" where the executor does not narrow them."""
        ...

    def lend(self, job_id: str) -> None:
        """The attempt (an asleep replica) lets others take its devices meanwhile."""
        ...

    def take_back(self, job_id: str) -> bool:
        """The lending attempt wants its devices again: True when it holds them again,
        False when another attempt holds one of them now (it must start afresh)."""
        ...
