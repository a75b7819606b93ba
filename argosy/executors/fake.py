"""An in-memory executor for tests of whatever drives executors (the server's loop).

It starts nothing: `start` records the attempt, `finish` (called by the test) makes it
end with an exit status, `stop` ends it as a stopped launcher does (exit 130). It keeps
its attempts across `adopt`, as a machine keeps its processes across a server restart,
and refuses to start a job that is already running, which is the invariant the real
executors must never be asked to break.

    fake = FakeExecutor([NodeInfo("n0", "cpu", 4)])
    fake.start(request); fake.finish("j1", 0); fake.poll()  # -> [AttemptExit(..., 0, ...)]
"""

from __future__ import annotations

from pathlib import Path

from argosy.executors.base import AttemptExit, LaunchRequest, NodeInfo, describe_exit, is_lost


class FakeExecutor:
    """Attempts as records; exits when the test says so."""

    name = "fake"
    lends_sleeping = True

    def __init__(self, nodes: list[NodeInfo]) -> None:
        self.nodes = list(nodes)
        self.running: dict[str, LaunchRequest] = {}
        self.started: list[tuple[str, int]] = []
        self._exits: list[AttemptExit] = []
        self.lent: set[str] = set()
        self.taken: set[str] = set()
        """Lenders whose devices a test says were taken meanwhile."""

    def inventory(self) -> list[NodeInfo]:
        return list(self.nodes)

    def start(self, request: LaunchRequest) -> None:
        assert request.job_id not in self.running, f"{request.job_id} started twice"
        self.running[request.job_id] = request
        self.started.append((request.job_id, request.attempt))

    def stop(self, job_id: str) -> None:
        if job_id in self.running:
            self.finish(job_id, 130)

    def finish(self, job_id: str, code: int | None, lost_node_ranks: tuple[int, ...] = ()) -> None:
        """The job's running attempt ends with `code` (None: it vanished), having lost the
        nodes of `lost_node_ranks` (as the Ray executor reports a gang's lost node)."""
        request = self.running.pop(job_id)
        self.lent.discard(job_id)
        self.taken.discard(job_id)
        lost = is_lost(code) or bool(lost_node_ranks)
        why = describe_exit(code)
        self._exits.append(AttemptExit(job_id, request.attempt, code, lost, why, lost_node_ranks))

    def unreported(self) -> set[str]:
        """Jobs whose attempt runs, or ended without being polled yet."""
        return set(self.running) | {e.job_id for e in self._exits}

    def poll(self) -> list[AttemptExit]:
        out, self._exits = self._exits, []
        return out

    def devices_busy(self, nodes: dict[str, int]) -> bool:
        """As the local executor counts: running attempts (lenders not) hold their
        devices until `finish`."""
        held = self._held(but="")
        return any(held.get(n, 0) + k > self._size(n, k) for n, k in nodes.items())

    def devices_of(self, job_id: str) -> str:
        return ""

    def lend(self, job_id: str) -> None:
        if job_id in self.running:
            self.lent.add(job_id)

    def take_back(self, job_id: str) -> bool:
        request = self.running.get(job_id)
        if job_id in self.taken or request is None:
            return False
        held = self._held(but=job_id)
        if any(held.get(n, 0) + k > self._size(n, k) for n, k in request.nodes.items()):
            return False
        self.lent.discard(job_id)
        return True

    def _held(self, but: str) -> dict[str, int]:
        held: dict[str, int] = {}
        for key, request in self.running.items():
            if key != but and key not in self.lent:
                for n, k in request.nodes.items():
                    held[n] = held.get(n, 0) + k
        return held

    def _size(self, node: str, default: int) -> int:
        return next((n.devices for n in self.nodes if n.name == node), default)

    def adopt(self, job_id: str, attempt: int, run_dir: Path) -> AttemptExit | None:
        request = self.running.get(job_id)
        if request is not None and request.attempt == attempt:
            return None
        for e in self._exits:  # ended while nobody polled: its status was recorded
            if (e.job_id, e.attempt) == (job_id, attempt):
                self._exits.remove(e)
                return e
        return AttemptExit(job_id, attempt, None, True, describe_exit(None))
