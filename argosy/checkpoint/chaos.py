"""Kill storms against real ranks, and the checks every restore must pass.

A CI test and the >= 1,000-fault soak (`benchmarks/soak.py`) run the same code:

    report = run_storm(directory, faults=6, seed=1, busy=1)
    assert report.violations == []

Each attempt starts `world_size` real ranks (gloo, their own persisters) that resume from
the checkpoint they agree on and then save a step every few milliseconds; the state of
step s is a pure function of s and the rank, so a loaded state can be checked byte by byte.
Every attempt carries one fault, drawn from `seed`: a SIGKILL of one trainer at a random
moment, or of one persister at a random visit of a point of the save / persist / commit
path (`faultpoints`). The driver then kills the other trainers (persisters live on, as
orphans do) and starts the next attempt with a newer epoch. `busy` processes spin beside
the ranks for CPU contention.

Checks after every restore (`audit`): all ranks resumed at the same step; that step is no
older than the newest intact commit present before the attempt started; the state every
rank loaded is the state of that step; every committed step verifies (sizes, checksums).

Worker: `python -m argosy.checkpoint.chaos worker DIR RANK WORLD ATTEMPT STEPS` (it runs
STEPS steps past the step it resumed from).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from argosy.checkpoint import disk, faultpoints
from argosy.core.procs import signal_by_env

RECORDS = "records.jsonl"
BIG = 1 << 18  # floats: a 1 MiB tensor goes through shared memory, not inline
STEP_S = 0.02
BACKSTOP_S = 15.0
"""A persister crash point not reached by then: the trainer is killed instead."""


# -- the worker (one rank) ----------------------------------------------------------------


def expected(step: int, rank: int) -> tuple[float, float]:
    """(big, small) fill values of the state of `step` on `rank`."""
    return float(step) + 0.25 * rank, -float(step) - 0.5 * rank


def _record(directory: Path, **fields: Any) -> None:
    line = json.dumps(fields) + "\n"
    fd = os.open(directory / RECORDS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def worker(directory: Path, rank: int, world: int, attempt: int, steps: int) -> None:
    import torch
    import torch.distributed as dist

    from argosy.checkpoint import FlashCheckpointer

    store = directory / f".store-{attempt}"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    state = {"big": torch.zeros(BIG), "small": torch.zeros(16), "meta": {"step": 0}}
    ckpt = FlashCheckpointer(directory / "ckpt", keep=3, linger_s=60, commit_timeout_s=60)
    got = ckpt.load(into=state)
    start = 0 if got is None else got[0]
    big, small = expected(start, rank)
    intact = got is None or (
        bool((got[1]["big"] == big).all())
        and bool((got[1]["small"] == small).all())
        and got[1]["meta"]["step"] == start
    )
    _record(
        directory,
        kind="resume",
        attempt=attempt,
        rank=rank,
        step=start,
        intact=intact,
        source=ckpt.last_load_source,
        decision=ckpt.last_decision,
    )
    beat = torch.zeros(1)
    ready = False
    for step in range(start + 1, start + steps + 1):
        if not ready and ckpt._is_ready():  # the driver's backstop counts from here
            ready = True
            _record(directory, kind="ready", attempt=attempt, rank=rank, step=step)
        dist.all_reduce(beat)  # ranks step in lockstep, as data-parallel training does
        ckpt.before_optimizer_step()
        big, small = expected(step, rank)
        state["big"].fill_(big)
        state["small"].fill_(small)
        state["meta"] = {"step": step}
        ckpt.save(step, state)
        time.sleep(STEP_S)
    last = ckpt.wait()
    ckpt.close()
    _record(directory, kind="done", attempt=attempt, rank=rank, step=last)
    dist.destroy_process_group()


# -- the driver ------------------------------------------------------------------------


@dataclass
class Report:
    """What a storm did and what it found."""

    faults: int = 0
    restores: int = 0
    commits_verified: int = 0
    resumed_steps: list[int] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    kinds: dict[str, int] = field(default_factory=dict)


def _spawn(directory: Path, rank: int, world: int, attempt: int, steps: int, env: dict) -> Any:
    cmd = [sys.executable, "-m", "argosy.checkpoint.chaos", "worker", str(directory)]
    cmd += [str(rank), str(world), str(attempt), str(steps)]
    log = open(directory / f"attempt{attempt}-rank{rank}.log", "wb")  # noqa: SIM115
    try:
        return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    finally:
        log.close()


def _records(directory: Path) -> list[dict]:
    path = directory / RECORDS
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def intact_commits(ckpt_dir: Path) -> tuple[list[int], list[str]]:
    """(committed steps that verify, problems of those that do not)."""
    good, problems = [], []
    for step in disk.committed_steps(ckpt_dir):
        step_dir = ckpt_dir / disk.step_dir_name(step)
        found = disk.verify(step_dir)
        if found and step_dir.exists():  # pruned meanwhile (renamed away whole) is no fault
            problems += found
        elif not found:
            good.append(step)
    return good, problems


def audit(resumes: list[dict], world: int, newest_before: int) -> list[str]:
    """Violations of one restore (the records of one attempt's `resume`)."""
    out = []
    if len(resumes) != world:
        return [f"{len(resumes)} of {world} ranks recorded a resume"]
    steps = {r["rank"]: r["step"] for r in resumes}
    attempt = resumes[0]["attempt"]
    if len(set(steps.values())) != 1:
        out.append(f"attempt {attempt}: ranks resumed apart: {steps}")
    if min(steps.values()) < newest_before:
        out.append(
            f"attempt {attempt}: resumed at {min(steps.values())}, older than the newest "
            f"intact commit {newest_before}"
        )
    out += [
        f"attempt {attempt}: rank {r['rank']} loaded a state that is not step {r['step']}'s"
        for r in resumes
        if not r["intact"]
    ]
    return out


class Storm:
    """One kill storm over one directory; see the module docstring."""

    def __init__(self, directory: Path, seed: int, world: int = 2, steps: int = 2000) -> None:
        self.directory = directory
        self.rng = random.Random(seed)
        self.world = world
        self.steps = steps
        self.job = f"storm-{seed}-{os.getpid()}-{time.monotonic_ns() % 10**6}"
        self.report = Report()
        directory.mkdir(parents=True, exist_ok=True)

    def _env(self, rank: int, crash: str | None) -> dict:
        env = dict(os.environ, ARGOSY_CKPT_JOB=self.job, OMP_NUM_THREADS="1")
        env["ARGOSY_CKPT_EPOCH"] = str(time.time_ns() // 1000)
        env.pop(faultpoints.ENV, None)
        if crash is not None:
            env[faultpoints.ENV] = crash
        return env

    def _fault(self) -> tuple[str, int, str | None, float]:
        """(kind, rank, persister crash spec or None, trainer kill delay s)."""
        rank = self.rng.randrange(self.world)
        if self.rng.random() < 0.5:
            point = self.rng.choice(faultpoints.POINTS)
            once_a_step = ("publish", "metadata", "commit", "renamed")
            nth = self.rng.randint(1, 2 if point in once_a_step else 6)
            return f"persister:{point}", rank, f"{point}:{nth}", BACKSTOP_S
        return "trainer", rank, None, self.rng.uniform(0.2, 6.0)

    def attempt(self, attempt: int, timeout_s: float = 120.0, steps: int | None = None) -> bool:
        """One attempt with one fault (none when `steps` is given: the attempt resumes,
        runs that many steps and ends); False when it finished (every rank done)."""
        good, problems = intact_commits(self.directory / "ckpt")
        self.report.violations += problems
        newest_before = max(good, default=0)
        kind, victim, crash, delay = self._fault() if steps is None else ("none", 0, None, 1e9)
        epoch_env = self._env(0, None)["ARGOSY_CKPT_EPOCH"]
        procs = []
        for rank in range(self.world):
            env = self._env(rank, crash if rank == victim else None)
            env["ARGOSY_CKPT_EPOCH"] = epoch_env
            run = self.steps if steps is None else steps
            procs.append(_spawn(self.directory, rank, self.world, attempt, run, env))
        resumed_at = self._wait_resumed(attempt, procs, timeout_s)
        kill_at = (resumed_at or time.monotonic()) + delay
        deadline = time.monotonic() + timeout_s
        waits_ready = crash is not None
        while time.monotonic() < deadline:
            codes = [p.poll() for p in procs]
            if all(c == 0 for c in codes) or any(c not in (None, 0) for c in codes):
                break
            if waits_ready and self._ready(attempt, victim):  # a persister crash point is
                waits_ready, kill_at = False, time.monotonic() + delay  # reachable from now
            if kind != "none" and not waits_ready and time.monotonic() >= kill_at:
                if kind != "trainer":
                    kind = f"{kind} (not reached; trainer)"
                procs[victim].send_signal(signal.SIGKILL)
                break
            time.sleep(0.02)
        if waits_ready and kind != "none" and all(p.poll() is None for p in procs):
            kind = f"{kind} (persister never ready; trainers killed)"
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
            p.wait()
        resumes = [r for r in _records(self.directory) if r["kind"] == "resume"]
        resumes = [r for r in resumes if r["attempt"] == attempt]
        self.report.violations += audit(resumes, self.world, newest_before)
        if resumes:
            self.report.restores += 1
            self.report.resumed_steps.append(resumes[0]["step"])
        done = all(c == 0 for c in (p.returncode for p in procs))
        if not done:
            self.report.faults += 1
            self.report.kinds[kind] = self.report.kinds.get(kind, 0) + 1
        return not done

    def _ready(self, attempt: int, rank: int) -> bool:
        """Whether `rank`'s persister answered ready in `attempt` (it may start slowly: the
        backstop of a persister fault counts from then, not from the resume)."""
        return any(
            r["kind"] == "ready" and r["attempt"] == attempt and r["rank"] == rank
            for r in _records(self.directory)
        )

    def _wait_resumed(self, attempt: int, procs: list, timeout_s: float) -> float | None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            got = [r for r in _records(self.directory) if r["attempt"] == attempt]
            if sum(r["kind"] == "resume" for r in got) == self.world:
                return time.monotonic()
            if any(p.poll() not in (None, 0) for p in procs):
                return None
            time.sleep(0.02)
        return None

    def finish(self) -> Report:
        good, problems = intact_commits(self.directory / "ckpt")
        self.report.commits_verified = len(good)
        self.report.violations += problems
        stop_persisters(self.job)
        from argosy.checkpoint.flash import reclaim

        reclaim(self.job)
        return self.report


def stop_persisters(job: str) -> None:
    """SIGKILL the persisters whose environment carries this storm's job."""
    signal_by_env("ARGOSY_CKPT_JOB", job, signal.SIGKILL)


def busy_loops(count: int) -> list[subprocess.Popen]:
    """CPU hogs that run beside the ranks (contention), until killed."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def run_storm(
    directory: Path, faults: int, seed: int, busy: int = 1, world: int = 2, steps: int = 2000
) -> Report:
    """`faults` attempts with one fault each, then one to finish; the report of all checks."""
    storm = Storm(directory, seed, world, steps)
    hogs = busy_loops(busy)
    try:
        for attempt in range(faults):
            storm.attempt(attempt)
        storm.attempt(faults, steps=3)  # a last restore, audited, then a clean end
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
        report = storm.finish()
    return report


def main(argv: list[str]) -> None:
    if argv[:1] == ["worker"]:
        directory, rank, world, attempt, steps = argv[1:6]
        worker(Path(directory), int(rank), int(world), int(attempt), int(steps))
        return
    raise SystemExit("usage: python -m argosy.checkpoint.chaos worker DIR RANK WORLD ATTEMPT STEPS")


if __name__ == "__main__":
    main(sys.argv[1:])
