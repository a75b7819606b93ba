"""A fast fault soak of the save / persist / restore path, checked byte for byte.

    report = run_soak(directory, faults=1000, seed=1)
    report.as_dict()   # faults, restores, torn, lost, wrong_restores, steps_lost_per_fault

The driver is the trainer (one rank, no process group): it keeps one checkpointer for as
long as its persister lives, saves steps whose state is a pure function of the step
(`chaos.expected`), and injects one fault per round, drawn from `seed`:

- `persister_kill`: SIGKILL of the persister at a random moment just after a save, or at
  a named point (copy, write, publish, commit, renamed) armed live through the fault file
  (`faultpoints.FILE_ENV`), so no restart is needed to arm it;
- `persister_hang`: the persister stops for good at copy, write or commit; the driver's
  `hang_timeout_s` notices, and it SIGKILLs the persister as the runtime's watchdog would;
- `trainer_lost`: the trainer's end of the connection goes away mid-run, which is what a
  SIGKILL of the trainer looks like to its persister (it settles the newest snapshot and
  lingers); the new checkpointer must adopt its slots or fence it;
- `disk_full`: the checkpoint file system fills up (a small tmpfs mounted for the soak
  when the process may mount one, else ENOSPC injected at write, publish or commit);
- `torn_file`, `corrupt_shard`, `torn_manifest`: a committed step's data file cut short,
  bytes flipped in the middle of it, or its manifest cut short.

After a kill, hang or lost trainer, a new checkpointer (a new epoch) restores with
`load(into=state)`; after a file or disk fault the live checkpointer restores (memory
first) and a reader of the disk alone restores too. Every restore is checked:

- `wrong_restores`: the state is not the bytes of the step returned, a damaged step came
  back from disk, or the restore raised something other than a clear CheckpointError;
- `lost`: the step returned is older than the newest intact committed step on disk;
- `torn`: after every round, a committed step the soak did not damage fails to verify.

`steps_lost_per_fault`: the newest step saved before the fault minus the step resumed
from, averaged over the restores of the trainer (not the disk-only reader).
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import subprocess
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from argosy.checkpoint import disk, faultpoints
from argosy.checkpoint.chaos import BIG, expected

KILL_POINTS = ("copy", "write", "publish", "metadata", "commit", "renamed")
HANG_POINTS = ("copy", "write", "commit")
ENOSPC_POINTS = ("write", "publish", "metadata", "commit")
KINDS: dict[str, float] = {
    "persister_kill": 0.13,
    "persister_hang": 0.03,
    "trainer_lost": 0.06,
    "disk_full": 0.14,
    "torn_file": 0.20,
    "corrupt_shard": 0.22,
    "torn_manifest": 0.22,
}
"""Share of each fault kind among the rounds: the kinds that restart the persister (a new
process imports torch: seconds on a loaded machine) are the fewer, so 1,000 faults fit in
well under an hour on a 2-core machine."""
TMPFS_BYTES = 48 << 20


@dataclass
class SoakReport:
    """What the soak injected and what its checks found."""

    faults: int = 0
    restores: int = 0
    torn: int = 0
    lost: int = 0
    wrong_restores: int = 0
    clear_errors: int = 0
    """Restores or saves that raised a CheckpointError naming the problem (disk full)."""
    steps_lost: list[int] = field(default_factory=list)
    kinds: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    disk_full_by: str = "injected ENOSPC"
    wall_s: float = 0.0

    def count(self, kind: str) -> None:
        self.faults += 1
        self.kinds[kind] = self.kinds.get(kind, 0) + 1

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        steps = out.pop("steps_lost")
        out["steps_lost_per_fault"] = round(sum(steps) / len(steps), 3) if steps else 0.0
        out["steps_lost_max"] = max(steps, default=0)
        out["problems"] = self.problems[:50]
        out["wall_s"] = round(self.wall_s, 1)
        out["s_per_fault"] = round(self.wall_s / max(1, self.faults), 3)
        return out


def _alive(pid: int) -> bool:
    from argosy.core.procs import pid_alive

    return pid_alive(pid)


def _mount_tmpfs(path: Path) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={TMPFS_BYTES}", "tmpfs", str(path)],
        capture_output=True,
    )
    return done.returncode == 0


def _unmount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], capture_output=True)


class Soak:
    """One soak over one directory; see the module docstring."""

    def __init__(
        self, directory: Path, seed: int, hang_timeout_s: float = 3.0, tmpfs: bool = True
    ) -> None:
        import torch

        self.directory = directory
        self.ckpt_dir = directory / "ckpt"
        self.fault_file = directory / "faults"
        directory.mkdir(parents=True, exist_ok=True)
        self.fault_file.write_text("")
        os.environ[faultpoints.FILE_ENV] = str(self.fault_file)  # persisters started from now
        self.tmpfs = _mount_tmpfs(self.ckpt_dir) if tmpfs else False
        self.rng = random.Random(seed)
        self.hang_timeout_s = hang_timeout_s
        self.job = f"soak-{seed}-{os.getpid()}"
        self.report = SoakReport(disk_full_by="tmpfs" if self.tmpfs else "injected ENOSPC")
        self.state: dict[str, Any] = {
            "big": torch.zeros(BIG),
            "small": torch.zeros(16),
            "meta": {"step": 0},
        }
        self.step = 0
        self.damaged: dict[int, int] = {}
        """Steps the soak damaged: step -> its manifest's mtime (a re-commit is whole)."""
        self.orphans: list[Any] = []
        self.ck = self._new_checkpointer()

    # -- the trainer's side ---------------------------------------------------------------

    def _new_checkpointer(self) -> Any:
        from argosy.checkpoint import FlashCheckpointer

        return FlashCheckpointer(
            self.ckpt_dir,
            keep=3,
            job_id=self.job,
            linger_s=20,
            commit_timeout_s=10,
            hang_timeout_s=self.hang_timeout_s,
        )

    def _save(self, count: int) -> None:
        for _ in range(count):
            self.ck.before_optimizer_step()
            self.step += 1
            big, small = expected(self.step, 0)
            self.state["big"].fill_(big)
            self.state["small"].fill_(small)
            self.state["meta"] = {"step": self.step}
            self.ck.save(self.step, self.state)

    def _arm(self, spec: str) -> None:
        self.fault_file.write_text(spec)

    def _disarm(self) -> None:
        self.fault_file.write_text("")

    def _until_dead(self, rounds: int = 8) -> bool:
        """Save and flush until the persister dies or hangs (a CheckpointError)."""
        from argosy.checkpoint import CheckpointError

        try:
            for _ in range(rounds):
                self._save(2)
                self.ck.wait()
        except CheckpointError:
            return True
        return False

    def _kill_persister(self) -> None:
        pid = self.ck.persister_pid
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def _restart(self) -> None:
        """The trainer restarts: the old checkpointer is dropped, a new one restores."""
        from argosy.checkpoint import CheckpointError

        self._disarm()
        with contextlib.suppress(CheckpointError, OSError):
            self.ck.close(timeout_s=self.hang_timeout_s)
        self.ck = self._new_checkpointer()
        self._restore_trainer()

    # -- faults ---------------------------------------------------------------------------

    def persister_kill(self) -> str:
        if self.rng.random() < 0.3:
            self._save(self.rng.randint(1, 3))
            time.sleep(self.rng.uniform(0.0, 0.05))  # mid-copy or mid-write, at random
            self._kill_persister()
            self._restart()
            return "persister_kill:random"
        point = self.rng.choice(KILL_POINTS)
        self._arm(f"{point}:{self.rng.randint(1, 2)}:kill")
        reached = self._until_dead()
        if not reached:
            self._kill_persister()
        self._restart()
        return f"persister_kill:{point}" + ("" if reached else " (not reached; killed)")

    def persister_hang(self) -> str:
        point = self.rng.choice(HANG_POINTS)
        self._arm(f"{point}:1:stall")
        self._until_dead()  # the hang timeout raises
        self._kill_persister()  # what the watchdog does to a wedged process
        self._restart()
        return f"persister_hang:{point}"

    def trainer_lost(self) -> str:
        import atexit

        self._save(self.rng.randint(1, 3))
        old = self.ck
        atexit.unregister(old.close)
        if old._launch is not None:  # the connection ends as a SIGKILL would end it
            old._launch.close()
        self.orphans.append(old._proc)
        self.ck = self._new_checkpointer()
        self._restore_trainer()
        return "trainer_lost"

    def disk_full(self) -> str:
        from argosy.checkpoint import CheckpointError

        filler = self.ckpt_dir / "filler.bin"
        if self.tmpfs:
            free = shutil.disk_usage(self.ckpt_dir).free
            room = self.rng.randint(0, BIG * 4 + (1 << 16))
            with contextlib.suppress(OSError), open(filler, "wb") as f:
                f.truncate(0)
                f.write(b"\0" * max(0, free - room))
            how = "tmpfs"
        else:
            self._arm(f"{self.rng.choice(ENOSPC_POINTS)}:1:enospc")
            how = "injected"
        try:
            self._save(2)
            self.ck.wait()
            how += " (it fit)"
        except CheckpointError as err:
            if "No space left" in str(err) or "ENOSPC" in str(err):
                self.report.clear_errors += 1
            else:
                self.report.problems.append(f"disk full gave an unclear error: {err}")
                self.report.wrong_restores += 1
        finally:
            filler.unlink(missing_ok=True)
            self._disarm()
        self._restore_both()
        return f"disk_full:{how}"

    def _damage(self, kind: str) -> str:
        steps = disk.committed_steps(self.ckpt_dir)
        if not steps:
            self._save(2)
            self.ck.wait()
            steps = disk.committed_steps(self.ckpt_dir)
        step = steps[-1] if self.rng.random() < 0.7 else self.rng.choice(steps)
        step_dir = self.ckpt_dir / disk.step_dir_name(step)
        data = step_dir / disk.data_file(0)
        try:
            if kind == "torn_file":
                size = data.stat().st_size
                os.truncate(data, self.rng.randint(0, max(0, size - 1)))
            elif kind == "corrupt_shard":
                size = data.stat().st_size
                with open(data, "r+b") as f:
                    f.seek(self.rng.randint(0, max(0, size - 8)))
                    f.write(os.urandom(8))
            else:
                manifest = step_dir / disk.MANIFEST
                os.truncate(manifest, self.rng.randint(0, max(0, manifest.stat().st_size - 1)))
            self.damaged[step] = (step_dir / disk.MANIFEST).stat().st_mtime_ns
        except OSError:  # pruned under our feet: nothing was damaged
            return f"{kind} (step gone)"
        self._restore_both()
        return kind

    # -- restores and checks ----------------------------------------------------------

    def _is_damaged(self, step: int) -> bool:
        manifest = self.ckpt_dir / disk.step_dir_name(step) / disk.MANIFEST
        try:
            return self.damaged.get(step) == manifest.stat().st_mtime_ns
        except OSError:
            return step in self.damaged

    def _intact(self) -> set[int]:
        return {s for s in disk.committed_steps(self.ckpt_dir) if not self._is_damaged(s)}

    def _restore_trainer(self) -> None:
        saved = self.step
        got = self._checked_load(self.ck.load, self.state, from_disk_only=False)
        self.step = 0 if got is None else got
        self.report.steps_lost.append(saved - self.step)

    def _restore_both(self) -> None:
        from argosy.checkpoint import FlashCheckpointer

        reader = FlashCheckpointer(
            self.ckpt_dir, job_id=f"{self.job}-disk", prestart=False, fence=False
        )
        try:
            self._checked_load(reader.load, self._blank(), from_disk_only=True)
        finally:
            reader.close()
        self._restore_trainer()

    def _blank(self) -> dict[str, Any]:
        import torch

        return {"big": torch.zeros(BIG), "small": torch.zeros(16), "meta": {"step": -1}}

    def _checked_load(self, load: Callable, into: dict, from_disk_only: bool) -> int | None:
        from argosy.checkpoint import CheckpointError

        before = self._intact()
        self.report.restores += 1
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                got = load(into=into)
        except CheckpointError as err:
            self.report.clear_errors += 1
            self.report.problems.append(f"restore raised: {err}")
            return None
        except Exception as err:  # not a clear error: a bug
            self.report.wrong_restores += 1
            self.report.problems.append(f"restore raised {type(err).__name__}: {err}")
            return None
        step = None if got is None else got[0]
        if got is not None:
            self._check_bytes(step, got[1], from_disk_only)
        newest = max(before & self._intact(), default=None)  # intact all along the restore
        if newest is not None and (step is None or step < newest):
            self.report.lost += 1
            where = "disk" if from_disk_only else "trainer"
            decision = getattr(load.__self__, "last_decision", None)
            self.report.problems.append(
                f"{where} restore: step {step} < newest intact {newest}; decision {decision}"
            )
        return step

    def _check_bytes(self, step: int, state: dict, from_disk_only: bool) -> None:
        big, small = expected(step, 0)
        good = (
            bool((state["big"] == big).all())
            and bool((state["small"] == small).all())
            and state["meta"]["step"] == step
        )
        damaged = from_disk_only and self._is_damaged(step)
        if not good or damaged:
            self.report.wrong_restores += 1
            why = "a damaged step" if damaged else "bytes differ"
            self.report.problems.append(f"restore of step {step}: {why}")

    def _verify_commits(self) -> None:
        for step in disk.committed_steps(self.ckpt_dir):
            if self._is_damaged(step):
                continue
            step_dir = self.ckpt_dir / disk.step_dir_name(step)
            problems = disk.verify(step_dir)
            if problems and step_dir.exists():  # pruned meanwhile (renamed away) is no fault
                self.report.torn += 1
                self.report.problems += problems

    # -- the loop -----------------------------------------------------------------------

    def _steady(self) -> None:
        """A few fault-free saves before the next fault; an error left over from the last
        one (a persist that failed after it) is taken as the trainer would take it."""
        from argosy.checkpoint import CheckpointError

        try:
            self._save(self.rng.randint(1, 4))
            if self.rng.random() < 0.5 and self.ck._is_ready():  # a starting persister:
                self.ck.wait()  # the saves go on meanwhile, as a trainer's would
        except CheckpointError as err:
            pid = self.ck.persister_pid
            if pid is None or not _alive(pid):
                self.report.problems.append(f"persister gone between faults: {err}")
                self._restart()

    def round(self) -> None:
        kind = self.rng.choices(list(KINDS), weights=list(KINDS.values()))[0]
        self._steady()
        inject = getattr(self, kind, None)
        label = inject() if inject is not None else self._damage(kind)
        self.report.count(label)
        self._verify_commits()
        self.orphans = [p for p in self.orphans if p.poll() is None]

    def close(self) -> None:
        from argosy.checkpoint import CheckpointError
        from argosy.checkpoint.flash import reclaim

        self._disarm()
        with contextlib.suppress(CheckpointError, OSError):
            self.ck.close(timeout_s=30)
        for proc in self.orphans:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait()
        reclaim(self.job)
        os.environ.pop(faultpoints.FILE_ENV, None)
        if self.tmpfs:
            _unmount(self.ckpt_dir)


def run_soak(
    directory: Path,
    faults: int,
    seed: int,
    on_fault: Callable[[SoakReport], None] | None = None,
    tmpfs: bool = True,
) -> SoakReport:
    """`faults` rounds of one fault each; the report of every check. `tmpfs=False` keeps
    the checkpoints on `directory`'s own file system (direct I/O in play there; a full
    disk is then an injected ENOSPC)."""
    started = time.monotonic()
    soak = Soak(directory, seed, tmpfs=tmpfs)
    try:
        while soak.report.faults < faults:
            soak.round()
            if on_fault is not None:
                on_fault(soak.report)
    finally:
        soak.close()
        soak.report.wall_s = time.monotonic() - started
    return soak.report
