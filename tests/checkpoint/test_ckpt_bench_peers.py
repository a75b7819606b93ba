"""The peers of benchmarks/checkpoint.py run (DCP async_save on CPU and on device state;
argosy with a floor per durable save), and argosy's pairs wait for its pruning."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "checkpoint.py"
sys.path.insert(0, str(BENCH.parent))

from checkpoint_peers import wait_pruned  # noqa: E402

from argosy.checkpoint import commit  # noqa: E402


def run_worker(peer: str, device: str) -> dict:
    cmd = [sys.executable, "-W", "ignore", str(BENCH), "--worker", peer, "--gb", "0.0625"]
    cmd += ["--repeats", "1", "--device", device]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-2000:]
    return json.loads(lines[-1][len("RESULT ") :])


def check(result: dict, same_saves: bool = True) -> None:
    """`same_saves`: stall and durable time were measured on the same saves (DCP async);
    argosy's come from different rounds (stalls, then durable saves), which load can order
    either way, so there both are only required to be measured."""
    assert result["stall_s"] > 0 and result["durable_s"] > 0
    if same_saves:
        assert result["stall_s"] <= result["durable_s"]
    assert result["disk_floor_s"] > 0 and result["disk_floor_writers"] in (1, 2, 4)


@pytest.mark.slow
def test_dcp_async_peer_on_cpu_state() -> None:
    check(run_worker("dcp_async", "cpu"))


@pytest.mark.gpu
def test_dcp_async_peer_on_device_state() -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    check(run_worker("dcp_async", "cuda"))


def _committed(work: Path, step: int) -> Path:
    step_dir = work / commit.step_dir_name(step)
    step_dir.mkdir()
    (step_dir / commit.MANIFEST).write_text("{}")
    return step_dir


def test_pairs_wait_for_argosy_to_prune(tmp_path: Path) -> None:
    for step in (1, 2, 3):
        _committed(tmp_path, step)
    with pytest.raises(TimeoutError):  # three committed steps, two kept
        wait_pruned(tmp_path, keep=2, timeout_s=0.05)
    (tmp_path / commit.step_dir_name(1)).rename(tmp_path / f"{commit.TRASH_PREFIX}x")
    with pytest.raises(TimeoutError):  # renamed away, not yet deleted
        wait_pruned(tmp_path, keep=2, timeout_s=0.05)
    (tmp_path / f"{commit.TRASH_PREFIX}x" / commit.MANIFEST).unlink()
    (tmp_path / f"{commit.TRASH_PREFIX}x").rmdir()
    wait_pruned(tmp_path, keep=2, timeout_s=0.05)


@pytest.mark.slow
def test_argosy_peer_pairs_every_durable_save_with_a_floor() -> None:
    result = run_worker("argosy", "cpu")
    check(result, same_saves=False)
    assert result["durable_pairs"]["pairs"] == 1 and result["durable_pairs"]["median"] > 0
    assert result["memmove_stall_pairs"]["pairs"] == 1  # the worker ran its copy alone too


def test_the_memmove_floor_copies_every_byte_in_order() -> None:
    from checkpoint_floors import memmove_once

    from argosy.checkpoint.pieces import PIECE_BYTES

    sizes = [3, PIECE_BYTES // 4 + 5, 0, 17]  # a tensor of several pieces, an empty one
    tensors = [torch.randint(0, 255, (n,), dtype=torch.uint8) for n in sizes]
    tensors[1] = torch.randint(0, 255, (PIECE_BYTES + 4 * 7,), dtype=torch.uint8).view(torch.int32)
    dst = torch.zeros(sum(t.numel() * t.element_size() for t in tensors), dtype=torch.uint8)
    assert memmove_once(tensors, dst) > 0
    assert torch.equal(dst, torch.cat([t.view(torch.uint8).flatten() for t in tensors]))
    assert memmove_once([tensors[1][::2]], dst) is None  # strided: not a memmove


def test_a_worker_cleans_up_only_its_own_slots(tmp_path: Path) -> None:
    """Workers of two peers run side by side (xdist): one's clean-up must not unlink the
    other's argosy slots, which silently lost a held snapshot before the hand-over."""
    from checkpoint import clean_shm, shm_files
    from checkpoint_peers import bench_job

    from argosy.checkpoint.segment import SHM_DIR, segment_name

    before = shm_files()
    other = SHM_DIR / segment_name("bench-1-0000beef", 0, 0)  # another worker's slot
    mine = SHM_DIR / segment_name(bench_job(), 0, 0)
    dlrover = Path("/dev/shm", "argosy-bench-0000beef_ckpt_shm_0")  # named by its run id
    try:
        for path in (other, mine, dlrover):
            path.write_bytes(b"x")
        clean_shm(before)  # (not the children: this process is pytest's, with a browser)
        assert other.exists(), "another worker's slot was unlinked"
        assert not mine.exists(), "this worker's own slot was left behind"
        assert not dlrover.exists(), "this worker's DLRover segment was left behind"
    finally:
        for path in (other, mine, dlrover):
            path.unlink(missing_ok=True)


def test_a_save_is_taken_against_the_floors_on_both_sides() -> None:
    """(floor before, save, floor after): the headline is the save over the two floors'
    mean, beside it the save over the faster floor (the strict bound) and the drift."""
    from checkpoint_floors import bracket_ratios

    got = bracket_ratios([(1.0, 1.5, 2.0), (2.0, 2.0, 2.0), (4.0, 1.0, 1.0)])
    assert got["median"] == 1.0 and got["pairs"] == 3  # 1.0, 1.0, 0.4
    assert got["low"] == 0.4
    assert got["over_faster"]["median"] == 1.0 and got["over_faster"]["high"] == 1.5
    assert got["over_before"]["median"] == 1.0 and got["over_after"]["low"] == 0.75
    assert got["drift"]["low"] == 0.25 and got["drift"]["high"] == 2.0
    assert bracket_ratios([]) == {}


@pytest.mark.slow
def test_a_lean_run_prints_each_peer_as_it_ends_and_writes_json(tmp_path: Path) -> None:
    """The floors once, then each peer's line the moment it ends (a peer that fails says
    why and the rest still run), and every figure in the JSON."""
    out = tmp_path / "bench.json"
    cmd = [sys.executable, "-W", "ignore", str(BENCH), "--sizes-gb", "0.0625", "--repeats", "1"]
    cmd += ["--loop-steps", "0", "--peers", "nosuch,torch_save", "--mode", "lean"]
    done = subprocess.run(cmd + ["--json", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("[0.0625 GB]")]
    assert lines[1].startswith("[0.0625 GB] floors (") and "memcpy floor" in lines[1]
    assert "nosuch (" in lines[3] and "failed" in lines[3]
    assert lines[5].startswith("[0.0625 GB] torch_save (") and "durable / disk floor" in lines[5]
    size = json.loads(out.read_text())["sizes"]["0.0625"]
    assert size["floors"]["floor_s"] > 0 and size["floors"]["disk_floor_s"] > 0
    assert size["floors"]["copy_floor"] == "memcpy"
    peer = size["peers"]["torch_save"]
    assert peer["stall_s"] > 0 and peer["durable_s"] > 0 and peer["disk_restore_s"] > 0
    assert peer["ratios"]["durable_over_disk_floor"] > 0 and peer["raw"]["torch"]
    assert size["peers"]["nosuch"]["missing"].startswith("failed")
    assert size["ratios"]["argosy_vs_dlrover"]["stall"] is None  # neither ran


def test_a_peer_past_its_time_is_stopped_and_reported() -> None:
    from checkpoint import run_peer

    got = run_peer("torch_save", 0.0625, 1, timeout_s=0.5)
    assert got["missing"].startswith("timed out after 0.5 s")
