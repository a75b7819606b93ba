"""The launcher's agent: run the group, watch it, stop it on a fault, restart, account.

    agent = Agent(spec, injections, RuntimeConfig())
    summary = agent.run()          # events.jsonl and summary.json land in spec.run_dir

One loop per attempt polls, every `poll_interval_s`, the rank processes (exits) and the
progress board (steps, collectives, restores, checkpoints, fired injections). The
decisions (hang, straggler) come from `watchdog`; this module applies them: it stops
the whole group (stacks first for a hang), restarts it up to `max_restarts` times, and
logs every step of it. The ranks resume from the latest flash checkpoint themselves.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from argosy.core.clock import Clock, SystemClock
from argosy.core.procs import signal_by_env
from argosy.health.config import NodePolicyConfig
from argosy.runtime import board, goodput, history, warm
from argosy.runtime.board import ProgressBoard, Slot, injected_at, ring_entries
from argosy.runtime.config import RuntimeConfig
from argosy.runtime.events import (
    EVENTS_FILE,
    SUMMARY_FILE,
    EventLog,
    read_events,
    write_json_atomic,
)
from argosy.runtime.group import GroupSpec, WorkerGroup, base_env, can_use_standby
from argosy.runtime.history import NODE_HEALTH_FILE
from argosy.runtime.inject import Injection, encode
from argosy.runtime.metering import Opener, RunMeter
from argosy.runtime.mixed.report import read_throughput
from argosy.runtime.node_health import node_health
from argosy.runtime.tee import RankTee
from argosy.runtime.watchdog import HangDetector, StragglerDetector

Progress = Callable[[int, int], None]


@dataclass
class Fault:
    """What went wrong in an attempt, as the agent saw it."""

    kind: str
    rank: int
    detected_at: float
    detail: str
    fields: dict[str, Any] = field(default_factory=dict)
    restart: bool = True


@dataclass
class _Watch:
    """Bookkeeping of one attempt's board reading."""

    seen: dict[int, int]
    attached: bool = False
    resumed: bool = False
    ckpts: float = 0.0
    last_end: float | None = None
    last_step: int = 0
    committed: int = 0


class Agent:
    """Runs one training job to completion or to the restart limit."""

    def __init__(
        self,
        spec: GroupSpec,
        injections: list[Injection],
        config: RuntimeConfig,
        clock: Clock | None = None,
        on_progress: Progress | None = None,
        on_event: Callable[[dict[str, Any]], None] | None = None,
        on_rank_line: Callable[[str], None] | None = None,
        preflight: dict[str, Any] | None = None,
        node_policy: NodePolicyConfig | None = None,
        energy_readers: Opener | None = None,
    ) -> None:
        self.spec = spec
        self.config = config
        self.clock = clock or SystemClock()
        self.on_progress = on_progress
        self.pending = dict(enumerate(injections))
        self.fired: dict[int, float] = {}
        self.spares_left = config.spares
        self.reported_stragglers: set[int] = set()
        self.standby: list[subprocess.Popen] = []
        self._persisters_asked = False
        """Whether the standbys were told to start their persisters ahead."""
        self._closing_since: float | None = None
        self.on_event = on_event
        self.on_rank_line = on_rank_line
        self._tee: RankTee | None = None
        self.preflight = preflight
        self.node_policy = node_policy or NodePolicyConfig()
        self.energy_readers = energy_readers

    def run(self) -> dict[str, Any]:
        spec = self.spec
        spec.t0 = self.clock.now_s()
        spec.run_id = spec.run_id or uuid.uuid4().hex[:12]
        spec.run_dir.mkdir(parents=True, exist_ok=True)
        history.archive_previous(spec.run_dir)
        board.reap_stale_boards(spec.board_path.parent)
        _reclaim_dead_runs_snapshots(spec.board_path.parent)
        self.log = EventLog(
            spec.run_dir / EVENTS_FILE, t0=spec.t0, clock=self.clock, listener=self.on_event
        )
        self.log.emit("start", **self._start_fields())
        if self.preflight is not None:
            self.log.emit("preflight", **self.preflight)
        self.meter = RunMeter(
            spec.run_dir,
            t0=spec.t0,
            clock=self.clock,
            interval_s=self.config.energy_interval_s,
            log_interval_s=self.config.energy_log_interval_s,
            open_readers=self.energy_readers,
        )
        self.meter.start()
        status, cause = "failed", None
        self._group: WorkerGroup | None = None
        try:
            self.board = ProgressBoard.create(spec.board_path, spec.world_size)
            write_json_atomic(spec.run_dir / SUMMARY_FILE, {"status": "running"})
            refused = (self.preflight or {}).get("refused")
            if refused:
                status, cause = "refused", {"kind": "preflight", "detail": refused}
            else:
                status, cause = self._attempts()
        except KeyboardInterrupt:
            status, cause = "interrupted", {"kind": "interrupted", "detail": "launcher stopped"}
        finally:
            with _signals_held():
                self._tee_flush()
                self._clean_up(self._group, status)
                self.meter.stop()
        with _signals_held():
            return self._write_summary(status, cause)

    def _attempts(self) -> tuple[str, dict[str, Any] | None]:
        """Run attempts until one completes or the restart budget is spent."""
        cause = None
        for attempt in range(self.config.max_restarts + 1):
            group = self._group = self._spawn(attempt)
            fault = self._watch(group, attempt)
            self._tee_flush()
            if fault is None:
                self._group = None
                return "completed", None
            last = attempt == self.config.max_restarts
            self._stop(group, fault, attempt, "give_up" if last else "restart")
            self._group = None
            cause = {"kind": fault.kind, "rank": fault.rank, "detail": fault.detail}
            cause["last_lines"] = {str(r): t for r, t in group.tail().items()}
            if last:
                self.log.emit("give_up", attempt=attempt, restarts=attempt, cause=cause)
                break
            self.log.emit("restart", attempt=attempt + 1, reason=fault.kind)
        return "failed", cause

    def _spawn(self, attempt: int) -> WorkerGroup:
        self.board.reset()
        standby, self.standby = self.standby, []
        group = WorkerGroup(self.spec, attempt, self._inject_env, standby)
        pids = [p.pid for p in group.procs]
        self.log.emit("spawn", attempt=attempt, pids=pids, warm=group.warm_started)
        if self.on_rank_line is not None:
            logs = {r: group.log_dir / f"rank{r}.log" for r in group.ranks()}
            self._tee = RankTee(logs, self.on_rank_line)
        return group

    def _tee_flush(self) -> None:
        if self._tee is not None:
            self._tee.flush()
            self._tee = None

    def _clean_up(self, group: WorkerGroup | None, status: str) -> None:
        """Leave nothing running, nothing in /dev/shm; close the log with the end event."""
        spec = self.spec
        if group is not None:  # interrupted or failed: leave nothing running
            group.stop(self.config.term_grace_s)
        for proc in self.standby:
            proc.kill()
            proc.wait()
        self.log.emit("end", status=status)
        for path in (spec.run_dir / "stacks").glob("*.txt"):
            if path.stat().st_size == 0:
                path.unlink()
        self.log.close()
        if hasattr(self, "board"):
            self.board.close()
        spec.board_path.unlink(missing_ok=True)
        _stop_leftovers(spec.run_id)
        _reclaim_snapshots(spec.run_id)

    def _write_summary(self, status: str, cause: dict | None) -> dict[str, Any]:
        spec = self.spec
        events = read_events(spec.run_dir / EVENTS_FILE)
        summary = goodput.summarize(events)
        summary["status"] = status
        summary["energy"] = self.meter.summary(events)
        throughput = read_throughput(spec.run_dir)  # mixed-chip launches write one
        if throughput is not None:
            summary["throughput"] = throughput
        closing = [e for e in events if e["event"] == "close_error"]
        if closing:
            summary["close_errors"] = [
                {k: e[k] for k in ("rank", "exit_code", "detail")} for e in closing
            ]
        if status != "completed":
            summary["cause"] = cause
        health = node_health(events, socket.gethostname(), self.node_policy)
        write_json_atomic(spec.run_dir / NODE_HEALTH_FILE, health)
        summary["node_health"] = {
            "node": health["node"],
            "state": health["record"]["state"],
            "evidence": len(health["evidence"]),
            "file": NODE_HEALTH_FILE,
        }
        write_json_atomic(spec.run_dir / SUMMARY_FILE, summary)
        return summary

    def _start_fields(self) -> dict[str, Any]:
        s = self.spec
        return {
            "run_id": s.run_id,
            "command": s.command,
            "world_size": s.world_size,
            "nnodes": s.nnodes,
            "nproc_per_node": s.nproc_per_node,
            "injections": [vars(i) | {"index": k} for k, i in self.pending.items()],
            "config": self.config.model_dump(),
            "launcher_pid": os.getpid(),
            "started_unix": round(time.time(), 3),
            "node": socket.gethostname(),
        }

    def _inject_env(self, rank: int) -> str:
        return encode({i: inj for i, inj in self.pending.items() if inj.rank == rank})

    # -- one attempt -------------------------------------------------------------------

    def _watch(self, group: WorkerGroup, attempt: int) -> Fault | None:
        spawned = self.clock.now_s()
        hang = HangDetector(self.config)
        slow = StragglerDetector(self.config, self.spec.world_size)
        watch = _Watch(seen=dict.fromkeys(group.ranks(), 0))
        while True:
            time.sleep(self.config.poll_interval_s)
            if self._tee is not None:
                self._tee.pump()
            now = self.clock.now_s()
            codes = group.poll()
            snap = self.board.snapshot()
            self._read_board(snap, watch, attempt, hang, slow)
            if watch.resumed and not self.standby:
                self._start_standby(snap)
            elif self.standby and not self._persisters_asked:
                self._prewarm_persisters(snap)
            closing = self._finished_then_failed(group, snap, codes, attempt, now)
            if closing is not None:
                if closing:
                    return None
                continue
            fault = self._exit_fault(snap, codes, now)
            if fault is not None:
                fault.fields["last_lines"] = group.tail().get(fault.rank, [])
                return fault
            if all(c == 0 for c in codes.values()):
                return None
            if self._lingering(group, snap, codes, now, attempt):
                return None
            live = [r for r, c in codes.items() if c is None and snap[r, Slot.T_DONE] == 0]
            verdict = hang.check(snap, live, spawned, now)
            if verdict is not None:
                return self._hang_fault(snap, verdict, now)
            fault = self._straggler(slow, snap, now, attempt)
            if fault is not None:
                return fault

    def _decision(self, attempt: int, rank: int) -> dict | None:
        """How the ranks chose the resume step, as the first rank recorded it."""
        path = self.spec.run_dir / "resume" / f"attempt{attempt}-rank{rank}.json"
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            return None

    def _finished_then_failed(
        self, group: WorkerGroup, snap: np.ndarray, codes: dict, attempt: int, now: float
    ) -> bool | None:
        """A rank failed after the run was done (every rank reached its target step and
        its last checkpoint is committed, or said `finish()`): the run completed; the
        error at close is recorded as an event, not as a fault to restart for. True once
        every rank exited (or `exit_timeout_s` passed), False while the others may still
        exit on their own, None when this is not such a case."""
        failed = {r: c for r, c in codes.items() if c not in (None, 0)}
        if not failed or not all(_done(snap, r) for r in failed):
            return None
        self._closing_since = self._closing_since or now
        running = [r for r, c in codes.items() if c is None]
        if running and now - self._closing_since <= self.config.exit_timeout_s:
            return False  # the others may still finish (or fail) on their own
        if not all(_done(snap, r) for r in codes):
            return None  # a rank never got there: a fault after all
        tails = group.tail()
        for rank, code in sorted(failed.items()):
            how = f"killed by signal {-code}" if code < 0 else f"exited with code {code}"
            self.log.emit(
                "close_error",
                attempt=attempt,
                rank=rank,
                exit_code=code,
                detail=f"rank {rank} {how} after the run was done",
                last_lines=tails.get(rank, []),
            )
        if running:
            group.stop(self.config.term_grace_s)
        return True

    def _prewarm_persisters(self, snap: np.ndarray) -> None:
        """Once this attempt took a flash checkpoint, each standby starts its rank's
        checkpoint persister ahead (warm.prewarm_persister)."""
        first = self.spec.first_rank
        ranks = range(first, first + self.spec.nproc_per_node)
        if any(snap[r, Slot.CKPT_COUNT] > 0 for r in ranks):
            self._persisters_asked = True
            for proc in self.standby:
                warm.prewarm_persister(proc)

    def _start_standby(self, snap: np.ndarray) -> None:
        """Warm processes for the next attempt, started once this one trains; each one
        also starts CUDA on the device its local rank works on now (the board says)."""
        if not (self.config.warm_standby and can_use_standby(self.spec.command)):
            return
        self.standby, self._persisters_asked = [], False
        for local in range(self.spec.nproc_per_node):
            env = base_env()
            env.setdefault("ARGOSY_CKPT_JOB", self.spec.run_id)  # its persister's, found at the end
            device = int(snap[self.spec.first_rank + local, Slot.CUDA_DEVICE]) - 1
            if device >= 0 and self.config.warm_cuda:
                env[warm.ENV_CUDA] = str(device)
            self.standby.append(warm.start_standby(env))

    def _lingering(
        self, group: WorkerGroup, snap: np.ndarray, codes: dict, now: float, attempt: int
    ) -> bool:
        """Every rank said it finished, yet some do not exit: stop them, the run is done."""
        done_at = [float(snap[r, Slot.T_DONE]) for r in codes]
        if not all(done_at) or now - max(done_at) <= self.config.exit_timeout_s:
            return False
        stuck = [r for r, c in codes.items() if c is None]
        self.log.emit("linger", attempt=attempt, ranks=stuck, waited_s=now - max(done_at))
        group.stop(self.config.term_grace_s)
        return True

    def _read_board(
        self,
        snap: np.ndarray,
        watch: _Watch,
        attempt: int,
        hang: HangDetector,
        slow: StragglerDetector,
    ) -> None:
        ranks = list(watch.seen)
        since = self.log.since_launch
        if not watch.attached and all(snap[r, Slot.T_ATTACH] > 0 for r in ranks):
            watch.attached = True
            t = max(snap[r, Slot.T_ATTACH] for r in ranks)
            self.log.emit("attached", t=since(t), attempt=attempt)
        if not watch.resumed and all(snap[r, Slot.T_RESTORED] > 0 for r in ranks):
            watch.resumed = True
            t = max(snap[r, Slot.T_RESTORED] for r in ranks)
            steps = {r: int(snap[r, Slot.RESTORED_STEP]) for r in ranks}
            step = min(steps.values())
            self.log.emit(
                "resume",
                t=since(t),
                attempt=attempt,
                step=step,
                rank_steps=steps,
                agreed=len(set(steps.values())) == 1,
                decision=self._decision(attempt, ranks[0]),
            )
            watch.last_end = t
        for rank in ranks:
            entries, watch.seen[rank] = ring_entries(snap, rank, watch.seen[rank])
            for step, loss, t_end, compute_s in entries:
                slow.observe(rank, step, compute_s)
                if rank == ranks[0]:
                    saved = (watch.last_end or 0.0) < snap[rank, Slot.T_CKPT] <= t_end
                    self._log_step(watch, attempt, hang, step, loss, t_end, saved)
        first = ranks[0]
        committed = int(snap[first, Slot.CKPT_COMMITTED])
        if committed > watch.committed:
            watch.committed = committed
            self.log.emit("commit", attempt=attempt, step=committed)
        if snap[first, Slot.CKPT_COUNT] > watch.ckpts:
            watch.ckpts = snap[first, Slot.CKPT_COUNT]
            step = int(snap[first, Slot.CKPT_STEP])
            self.log.emit(
                "checkpoint", t=since(snap[first, Slot.T_CKPT]), attempt=attempt, step=step
            )

    def _log_step(
        self,
        watch: _Watch,
        attempt: int,
        hang: HangDetector,
        step: int,
        loss: float,
        t_end: float,
        saved: bool,
    ) -> None:
        dur = t_end - watch.last_end if watch.last_end else None
        if dur is not None and not saved:  # a save's stall is not the step time
            hang.observe_step_time(dur)
        watch.last_end, watch.last_step = t_end, step
        fields = {"attempt": attempt, "step": step, "loss": loss}
        self.log.emit("step", t=self.log.since_launch(t_end), **fields)
        if self.on_progress:
            self.on_progress(step, attempt)

    # -- faults ------------------------------------------------------------------------

    def _injected(self, snap: np.ndarray, rank: int, kinds: set[str]) -> float | None:
        for index, inj in self.pending.items():
            at = injected_at(snap, rank, index) if rank < snap.shape[0] else 0.0
            if inj.rank == rank and inj.fault in kinds and at > 0:
                return at
        return None

    def _exit_fault(
        self, snap: np.ndarray, codes: dict[int, int | None], now: float
    ) -> Fault | None:
        failed = {r: c for r, c in codes.items() if c not in (None, 0)}
        if not failed:
            return None
        injected = [r for r in failed if self._injected(snap, r, {"crash", "exit"})]
        signalled = [r for r, c in failed.items() if c < 0]
        rank = (injected or signalled or sorted(failed))[0]
        code = failed[rank]
        kind = "crash" if code < 0 else "exit"
        how = f"killed by signal {-code}" if code < 0 else f"exited with code {code}"
        detail = f"rank {rank} {how}"
        at = self._injected(snap, rank, {"crash", "exit"})
        fields = {"exit_code": code, "failed_ranks": sorted(failed), "injected_at": at}
        return Fault(kind, rank, now, detail, fields)

    def _hang_fault(self, snap: np.ndarray, verdict: Any, now: float) -> Fault:
        rank = verdict.missing_ranks[0] if verdict.missing_ranks else 0
        at = self._injected(snap, rank, {"hang"})
        fields = {
            "injected_at": at,
            "stalled_since": verdict.since_s,
            "threshold_s": verdict.threshold_s,
            "collective_seq": verdict.collective_seq,
            "missing_ranks": list(verdict.missing_ranks),
        }
        return Fault("hang", rank, now, verdict.detail, fields)

    def _straggler(
        self, slow: StragglerDetector, snap: np.ndarray, now: float, attempt: int
    ) -> Fault | None:
        verdict = slow.check(now, exclude=self.reported_stragglers)
        if verdict is None:
            return None
        self.reported_stragglers.add(verdict.rank)
        at = self._injected(snap, verdict.rank, {"straggler"})
        restart = self.config.straggler_policy == "restart" and self.spares_left > 0
        detail = f"rank {verdict.rank} computes {verdict.slowdown:.2f}x slower than its peers"
        if self.config.straggler_policy == "restart" and not restart:
            detail += " (no spare left to restart onto: --spares)"
        fields = {
            "injected_at": at,
            "slowdown": verdict.slowdown,
            "steps": [verdict.first_step, verdict.last_step],
        }
        fault = Fault("straggler", verdict.rank, now, detail, fields, restart=restart)
        if not restart:
            self._emit_fault(fault, attempt, action="warn")
            return None
        self.spares_left -= 1
        for index, inj in list(self.pending.items()):  # the slow device is swapped out
            if inj.rank == verdict.rank and inj.kind == "slow":
                del self.pending[index]
        self.reported_stragglers.discard(verdict.rank)
        return fault

    def _emit_fault(self, fault: Fault, attempt: int, action: str) -> None:
        fields = dict(fault.fields)
        at = fields.pop("injected_at", None)
        stalled = fields.pop("stalled_since", None)
        since = self.log.since_launch
        self.log.emit(
            "fault",
            t=since(fault.detected_at),
            kind=fault.kind,
            rank=fault.rank,
            attempt=attempt,
            action=action,
            detail=fault.detail,
            injected_at_s=since(at) if at else None,
            stalled_since_s=since(stalled) if stalled else None,
            detected_at_s=since(fault.detected_at),
            **fields,
        )

    def _stop(self, group: WorkerGroup, fault: Fault, attempt: int, action: str) -> None:
        self._emit_fault(fault, attempt, action=action)
        dump = self.config.stack_dump_wait_s if fault.kind == "hang" else 0.0
        snap = self.board.snapshot()
        killed = group.stop(self.config.term_grace_s, dump_stacks_s=dump)
        stacks = self._stack_files(attempt)
        self.log.emit("stopped", attempt=attempt, needed_kill=killed, stacks=stacks)
        for index, inj in list(self.pending.items()):
            fired = injected_at(snap, inj.rank, index) if inj.rank < snap.shape[0] else 0.0
            if fired > 0 and inj.kind != "slow":
                del self.pending[index]

    def _stack_files(self, attempt: int) -> list[str]:
        out = []
        for path in sorted((self.spec.run_dir / "stacks").glob(f"attempt{attempt}-rank*.txt")):
            if path.stat().st_size > 0:
                out.append(str(path.relative_to(self.spec.run_dir)))
            else:
                path.unlink()
        return out


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Ignore SIGINT and SIGTERM while the agent cleans up and writes the summary, so a
    second Ctrl-C cannot leave ranks running or the previous summary in place."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in held.items():
            signal.signal(sig, handler)


def _done(snap: np.ndarray, rank: int) -> bool:
    """The rank said `finish()`, or reached its target step with that step committed."""
    if snap[rank, Slot.T_DONE] > 0:
        return True
    target = snap[rank, Slot.TARGET_STEP]
    reached = snap[rank, Slot.STEP] >= target
    return bool(target > 0 and reached and snap[rank, Slot.CKPT_COMMITTED] >= target)


def _reclaim_snapshots(run_id: str) -> None:
    """Free the run's flash-checkpoint segments in /dev/shm: the run is over."""
    try:
        from argosy.checkpoint.segment import job_segments  # light: no torch
    except ImportError:
        return
    for path in job_segments(run_id):
        path.unlink(missing_ok=True)


def _reclaim_dead_runs_snapshots(board_dir: Path) -> None:
    """Free the flash-checkpoint segments of this user's runs whose launcher died."""
    try:
        from argosy.checkpoint.segment import stale_run_segments  # light: no torch
    except ImportError:
        return
    for path in stale_run_segments(board.live_runs(board_dir)):
        path.unlink(missing_ok=True)


def _stop_leftovers(run_id: str) -> None:
    """SIGTERM what our ranks left running (a killed rank's lingering checkpoint persister):
    processes whose environment carries this run's ARGOSY_CKPT_JOB."""
    signal_by_env("ARGOSY_CKPT_JOB", run_id, signal.SIGTERM)
