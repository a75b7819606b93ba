"""Faults: a SIGKILLed trainer, torn checkpoints, a full or unwritable disk, /dev/shm leaks."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch

from argosy.checkpoint import CheckpointError, FlashCheckpointer
from argosy.checkpoint import commit as ckcommit
from argosy.checkpoint import disk as ckdisk
from argosy.checkpoint.segment import job_segments


def run_trainer(ck, directory, job, steps, kill_after=None) -> tuple[int, list[str]]:
    cmd = [sys.executable, "-W", "ignore", ck.trainer, str(directory), str(steps), "--job", job]
    if kill_after is not None:
        cmd += ["--kill-after", str(kill_after)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=ck.env_with_repo())
    return proc.returncode, proc.stdout.split("\n") + proc.stderr.split("\n")[-8:]


def persisters_of(job: str) -> list[int]:
    """Live persister processes whose slots belong to `job` (found through their owner pid)."""
    from argosy.checkpoint.segment import Segment

    pids = set()
    for path in job_segments(job):
        seg = Segment.open(path)
        head = seg.header()
        seg.close()
        if head and head.owner_pid and os.path.exists(f"/proc/{head.owner_pid}"):
            pids.add(head.owner_pid)
    return sorted(pids)


@pytest.mark.slow
def test_sigkill_right_after_save_then_restart_resumes_that_step_from_memory(tmp_path, job, ck):
    rc, out = run_trainer(ck, tmp_path, job, steps=6, kill_after=3)
    assert rc == -9
    saved = {line.split()[1]: line.split()[2] for line in out if line.startswith("SAVED")}
    assert list(saved) == ["0", "1", "2", "3"]
    rc, out = run_trainer(ck, tmp_path, job, steps=6)
    assert rc == 0, out
    resumed = next(line.split() for line in out if line.startswith("RESUMED"))
    assert resumed[1] == "3" and resumed[3] == "memory", out
    assert resumed[2] == saved["3"]  # the weights right after step 3, bit for bit
    assert "DONE" in out
    assert ckdisk.committed_steps(tmp_path)[-1] == 5
    deadline = time.monotonic() + 10
    while (job_segments(job) or persisters_of(job)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not job_segments(job), "the restarted run adopted and then freed the old slots"


@pytest.mark.slow
def test_an_orphaned_persister_writes_the_last_snapshot_to_disk(tmp_path, job, ck):
    rc, _ = run_trainer(ck, tmp_path, job, steps=6, kill_after=2)
    assert rc == -9
    deadline = time.monotonic() + 30
    while 2 not in ckdisk.committed_steps(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert 2 in ckdisk.committed_steps(tmp_path)
    # a fresh run with no shared memory at all (as on another host) resumes from disk
    for pid in persisters_of(job):
        os.kill(pid, 9)
    for path in job_segments(job):
        path.unlink()
    with FlashCheckpointer(tmp_path, job_id=job) as ckpt:
        step, state = ckpt.load()
        assert (step, ckpt.last_load_source, state["loop"]["step"]) == (2, "disk", 2)


def _truncate(step_dir):
    path = step_dir / ckdisk.data_file(0)
    os.truncate(path, path.stat().st_size // 2)


def _flip_byte(step_dir):
    path = step_dir / ckdisk.data_file(0)
    with open(path, "r+b") as f:
        f.seek(path.stat().st_size // 2)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0xFF]))


def _drop_manifest(step_dir):
    (step_dir / ckdisk.MANIFEST).unlink()


def _unfinished(step_dir):  # what a persister killed before its commit leaves
    os.rename(step_dir, step_dir.parent / ckcommit.tmp_dir_name(int(step_dir.name[5:]), 1))


@pytest.fixture(scope="module")
def two_steps(tmp_path_factory):
    """A directory with durable steps 1 and 2 (states seeded 1 and 2)."""
    import uuid

    from ckpt_helpers import small_state

    directory = tmp_path_factory.mktemp("two-steps")
    job = f"test-{uuid.uuid4().hex[:10]}"
    with FlashCheckpointer(directory, keep=3, job_id=job) as ckpt:
        ckpt.save(1, small_state(1))
        ckpt.wait()
        ckpt.save(2, small_state(2))
        ckpt.wait()
    assert not job_segments(job)
    return directory


@pytest.mark.parametrize(
    "tear, want_warning",
    [
        (_truncate, "truncated"),
        (_flip_byte, "checksum mismatch"),
        (_drop_manifest, None),
        (_unfinished, None),
    ],
    ids=["truncated-file", "checksum-mismatch", "no-manifest", "killed-before-commit"],
)
def test_a_torn_step_is_skipped_for_the_previous_one(
    two_steps, tmp_path, job, ck, tear, want_warning
):
    import shutil

    directory = tmp_path / "ckpt"
    shutil.copytree(two_steps, directory)
    tear(directory / ckdisk.step_dir_name(2))
    with FlashCheckpointer(directory, job_id=job, prestart=False) as ckpt:
        if want_warning:
            with pytest.warns(UserWarning, match=f"step 2: .*{want_warning}"):
                step, got = ckpt.load()
        else:
            step, got = ckpt.load()
    assert step == 1
    ck.assert_same(got, ck.small_state(1))


_FULL_DISK = r"""
import resource, signal, sys, torch
from argosy.checkpoint import FlashCheckpointer, CheckpointError
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # inherited: writes past the limit fail (EFBIG)
ckpt = FlashCheckpointer(sys.argv[1], job_id=sys.argv[2])
big = {"w": torch.ones(1 << 20)}  # 4 MiB
ckpt.save(1, big); ckpt.wait()
# the disk "fills up": the persister may now write files of at most 1 MiB
resource.prlimit(ckpt._proc.pid, resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
big["w"].add_(1)
ckpt.save(2, big)
try:
    ckpt.wait()
    print("NO ERROR")
except CheckpointError as err:
    print("ERROR", err)
big["w"].add_(1)  # training goes on with intact tensors
print("TRAINING", float(big["w"][0]))
step, state = ckpt.load(step=1)
ckpt.close()
print("LOADED", step, float(state["w"].sum()))
"""


@pytest.mark.slow
def test_a_full_disk_reaches_the_trainer_and_keeps_earlier_steps(tmp_path, job, ck):
    proc = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", _FULL_DISK, str(tmp_path), job],
        capture_output=True,
        text=True,
        timeout=120,
        env=ck.env_with_repo(),
    )
    out = proc.stdout
    assert "ERROR persisting step 2" in out and "File too large" in out, out + proc.stderr
    assert "TRAINING 3.0" in out and f"LOADED 1 {float(1 << 20)}" in out
    assert ckdisk.committed_steps(tmp_path) == [1]
    assert not list(tmp_path.glob(ckcommit.TMP_PREFIX + "*")), "the failed step was cleaned up"


def test_an_unwritable_directory_fails_on_wait(tmp_path, job):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with FlashCheckpointer(blocker / "ckpt", job_id=job) as ckpt:
        ckpt.save(1, {"w": torch.ones(10)})
        with pytest.raises(CheckpointError, match="persisting step 1 .* failed"):
            ckpt.wait()
        step, _ = ckpt.load()  # still restorable from memory
        assert step == 1


class _ResetConnection:
    """A connection whose peer was SIGKILLed mid-message: a reset, not an EOF."""

    def poll(self, timeout: float = 0.0) -> bool:
        return True

    def recv(self) -> None:
        raise ConnectionResetError(104, "Connection reset by peer")

    def close(self) -> None:
        pass


def test_a_reset_connection_is_a_checkpoint_error_naming_the_log(tmp_path, job, ck):
    ckpt = FlashCheckpointer(tmp_path, job_id=job)
    try:
        ckpt.save(1, ck.small_state())
        ckpt.wait()
        live = ckpt._conn
        ckpt._conn = _ResetConnection()
        ckpt._pending = 2
        with pytest.raises(CheckpointError, match=r"exited unexpectedly.*ConnectionResetError"):
            ckpt.before_optimizer_step()
    finally:
        ckpt._conn, ckpt._pending = live, None
        ckpt.close()
