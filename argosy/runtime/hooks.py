"""In-script hooks: a few lines in a training script connect it to `argosy launch`.

    rt = hooks.attach()                  # after init_process_group
    rt.watch_ddp(model)                  # count and time DDP's gradient all-reduces
    rt.work_per_step(tokens=batch * seq * world)   # optional: tokens per joule in the summary
    ckpt = open_checkpointer(dir, progress=rt.checkpoint_progress)
    rt.restored(start_step, target_step=steps, decision=ckpt.last_decision)
    for step in range(start_step + 1, steps + 1):
        rt.step_begin(step)              # injected faults fire here
        with rt.compute():               # forward pass: the straggler detector times it
            loss = model(x, y)
        loss.backward()
        with rt.checkpoint_fence(): ckpt.before_optimizer_step()
        opt.step()
        rt.step_end(step, loss)
        if step % k == 0:
            with rt.checkpointing(step):
                ckpt.save(step, state)
    with rt.checkpoint_fence(): rt.committed(ckpt.wait())
    rt.finish()

Everything goes to this rank's row of the progress board in shared memory: writes are
plain memory stores, so they never block and a rank stuck anywhere cannot stall the
agent. Under no launcher (no ARGOSY_BOARD), the hooks write to a private row and do
nothing else. SIGUSR1 makes the rank write every thread's Python stack to the run
directory (faulthandler, so it works even while the rank is blocked in C code).
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from argosy.runtime import inject
from argosy.runtime.board import ROW, BoardRow, ProgressBoard, Slot

ENV_BOARD = "ARGOSY_BOARD"
ENV_RUN_DIR = "ARGOSY_RUN_DIR"
ENV_CKPT_DIR = "ARGOSY_CKPT_DIR"
"""The job's checkpoint store, the same directory for every node rank (`argosy launch
--ckpt-dir`); read it through `checkpoint_dir()`."""
ENV_T0 = "ARGOSY_T0"
ENV_ATTEMPT = "ARGOSY_ATTEMPT"
ENV_INJECT = "ARGOSY_INJECT"
PHASES = {
    "start": 1,
    "allocate": 2,
    "copy": 3,
    "copied": 4,
    "write": 5,
    "commit": 6,
    "committed": 7,
}
"""Checkpoint phases as the board's CKPT_PHASE numbers."""


def checkpoint_dir(fallback_run_dir: str | Path = ".") -> Path:
    """Where this rank saves and restores checkpoints: the job's store (ARGOSY_CKPT_DIR,
    which `argosy launch` sets, one path for all node ranks), else `<run dir>/checkpoints`
    (ARGOSY_RUN_DIR, else `fallback_run_dir` outside a launcher)."""
    if os.environ.get(ENV_CKPT_DIR):
        return Path(os.environ[ENV_CKPT_DIR])
    return Path(os.environ.get(ENV_RUN_DIR) or fallback_run_dir) / "checkpoints"


class Runtime:
    """This rank's connection to the agent; see the module docstring for the calls."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        env = dict(os.environ if env is None else env)
        self.rank = int(env.get("RANK", "0"))
        self.world_size = int(env.get("WORLD_SIZE", "1"))
        self.attempt = int(env.get(ENV_ATTEMPT, env.get("TORCHELASTIC_RESTART_COUNT", "0")))
        self.run_dir = Path(env[ENV_RUN_DIR]) if ENV_RUN_DIR in env else None
        self.launched = ENV_BOARD in env
        self._t0 = float(env.get(ENV_T0, time.monotonic()))
        self._row = self._open_row(env)
        self._injections = inject.decode(env.get(ENV_INJECT, ""))
        self._slow: tuple[int, float] | None = None
        self._compute_s = 0.0
        self._stack_file = None
        self._row.set(Slot.PID, os.getpid())
        self._row.set(Slot.ATTEMPT, self.attempt)
        self._touch(Slot.T_ATTACH)
        self._arm_stack_dump()

    def _open_row(self, env: dict[str, str]) -> BoardRow:
        if ENV_BOARD not in env:
            return BoardRow(np.zeros(ROW))
        return ProgressBoard.attach(Path(env[ENV_BOARD])).row(self.rank)

    def _arm_stack_dump(self) -> None:
        if self.run_dir is None:
            return
        stacks = self.run_dir / "stacks"
        stacks.mkdir(parents=True, exist_ok=True)
        path = stacks / f"attempt{self.attempt}-rank{self.rank}.txt"
        self._stack_file = path.open("w")
        faulthandler.register(signal.SIGUSR1, file=self._stack_file, all_threads=True)

    def _touch(self, slot: Slot) -> float:
        now = time.monotonic()
        self._row.set(slot, now)
        self._row.set(Slot.HEARTBEAT, now)
        return now

    # -- progress ---------------------------------------------------------------------

    def restored(
        self, step: int, target_step: int | None = None, decision: dict | None = None
    ) -> None:
        """The checkpoint (or a fresh start, step 0) is loaded; training resumes after it.

        `target_step`: the step the script trains to (lets the agent tell a run that
        finished from one that failed); `decision`: how the checkpointer chose the step
        (written to `<run dir>/resume/`, and into the agent's `resume` event).
        """
        if decision is not None and self.run_dir is not None:
            folder = self.run_dir / "resume"
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / f"attempt{self.attempt}-rank{self.rank}.json"
            path.write_text(json.dumps(decision, default=str))
        if target_step:
            self._row.set(Slot.TARGET_STEP, target_step)
        from argosy.hardware.backends import cuda  # here: a rank's import stays light

        self._row.set(Slot.CUDA_DEVICE, cuda.current_device() + 1)
        self._row.set(Slot.RESTORED_STEP, step)
        self._touch(Slot.T_RESTORED)

    def work_per_step(self, tokens: int | None = None, samples: int | None = None) -> None:
        """What one step of the whole job processes (all ranks together), so the run's
        summary can say tokens (samples) per joule; rank 0 writes it to `work.json`."""
        if self.rank != 0 or self.run_dir is None:
            return
        work = {"tokens_per_step": tokens, "samples_per_step": samples}
        (self.run_dir / "work.json").write_text(json.dumps(work))

    def committed(self, step: int | None) -> None:
        """`step` is committed on disk (what `ckpt.wait()` returned)."""
        if step is not None:
            self._row.set(Slot.CKPT_COMMITTED, step)
        self._row.set(Slot.HEARTBEAT, time.monotonic())

    def checkpoint_progress(self, phase: str, done_bytes: int) -> None:
        """The checkpointer moved (`FlashCheckpointer(progress=...)`): bytes copied,
        written or arriving from other ranks. While a rank is inside a checkpoint call,
        this is the progress the hang detector follows. Phase "committed" carries the
        newest committed step instead of bytes."""
        if phase == "committed":  # the value is the newest committed step
            self._row.set(Slot.CKPT_COMMITTED, done_bytes)
        else:
            self._row.set(Slot.CKPT_PROGRESS, done_bytes)
        self._row.set(Slot.CKPT_PHASE, PHASES.get(phase, 0))
        self._row.set(Slot.T_CKPT_PROGRESS, time.monotonic())

    def step_begin(self, step: int) -> None:
        """A step starts: fire any injection due now, then stamp the step's start."""
        self._compute_s = 0.0
        for index, inj in list(self._injections.items()):
            if inj.due(step, time.monotonic() - self._t0):
                self._fire(index, inj, step)
        self._touch(Slot.T_STEP_BEGIN)

    @contextmanager
    def compute(self) -> Iterator[None]:
        """Time local compute (no collectives inside); an injected slowdown stretches it."""
        start = time.monotonic()
        yield
        elapsed = time.monotonic() - start
        if self._slow is not None:
            time.sleep((self._slow[1] - 1.0) * elapsed)
        self._compute_s += time.monotonic() - start

    def step_end(self, step: int, loss: Any = float("nan")) -> None:
        """The step is done (after the optimizer step); `loss` may be a tensor or a float."""
        value = float(loss.item() if hasattr(loss, "item") else loss)
        self._row.push_step(step, value, time.monotonic(), self._compute_s)

    @contextmanager
    def checkpointing(self, step: int) -> Iterator[None]:
        """Wrap the hand-off of `step` to the checkpointer (`ckpt.save`)."""
        self._row.set(Slot.CKPT_STEP, step)
        self._touch(Slot.T_CKPT)
        with self.checkpoint_fence():
            yield
        self._row.add(Slot.CKPT_COUNT)

    @contextmanager
    def checkpoint_fence(self) -> Iterator[None]:
        """Wrap checkpoint calls that may block (`before_optimizer_step`, `wait`): while
        inside, the checkpoint's own progress (`checkpoint_progress`) counts as the rank's,
        so a save that moves is never a hang and one that stops is caught as fast as any."""
        self._row.set(Slot.CKPT_BUSY, 1)
        try:
            yield
        finally:
            self._row.set(Slot.CKPT_BUSY, 0)
            self._row.set(Slot.HEARTBEAT, time.monotonic())

    def finish(self) -> None:
        """Training is over; the rank is about to exit on its own."""
        self._touch(Slot.T_DONE)

    # -- collectives -------------------------------------------------------------------

    def enter_collective(self) -> None:
        self._row.add(Slot.COLL_ENTERED)
        self._touch(Slot.T_COLL_ENTER)

    def exit_collective(self) -> None:
        self._row.add(Slot.COLL_EXITED)
        self._row.set(Slot.HEARTBEAT, time.monotonic())

    @contextmanager
    def collective(self) -> Iterator[None]:
        """Wrap a blocking collective so the watchdog can tell who never entered it."""
        self.enter_collective()
        yield
        self.exit_collective()

    def watch_ddp(self, ddp_model: Any) -> None:
        """Replace DDP's all-reduce hook by the same reduction, counted and timed."""
        import torch.distributed as dist

        world = dist.get_world_size()

        def hook(_state, bucket):  # noqa: ANN001, ANN202  # DDP checks annotations
            self.enter_collective()
            tensor = bucket.buffer().div_(world)
            fut = dist.all_reduce(tensor, async_op=True).get_future()

            def done(f: Any) -> Any:
                self.exit_collective()
                return f.value()[0]

            return fut.then(done)

        ddp_model.register_comm_hook(None, hook)

    # -- fault injection ---------------------------------------------------------------

    def _fire(self, index: int, inj: inject.Injection, step: int) -> None:
        now = time.monotonic()
        if inj.kind == "slow":
            if self._slow is None:
                self._row.fired(index, now)
                print(f"[argosy] injected: {inj.describe()} (step {step})", file=sys.stderr)
            self._slow = (index, inj.factor)
            return
        del self._injections[index]
        self._row.fired(index, now)
        print(f"[argosy] injected: {inj.describe()} (step {step})", file=sys.stderr, flush=True)
        _ACTIONS[inj.kind](inj)


def _kill(_inj: inject.Injection) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _exit(inj: inject.Injection) -> None:
    os._exit(inj.code)


def _hang(_inj: inject.Injection) -> None:
    while True:  # a rank that stops making progress, as a wedged device would
        time.sleep(3600)


_ACTIONS = {"kill": _kill, "exit": _exit, "hang": _hang}

_runtime: Runtime | None = None


def attach() -> Runtime:
    """This process's Runtime (created on first call, from the launcher's environment)."""
    global _runtime
    if _runtime is None:
        _runtime = Runtime()
    return _runtime
