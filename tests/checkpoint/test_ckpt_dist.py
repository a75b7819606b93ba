"""Two gloo ranks with a sharded (DTensor) and a replicated tensor; reload at another size."""

from __future__ import annotations

import pytest
import torch

from argosy.checkpoint import FlashCheckpointer
from argosy.checkpoint import disk as ckdisk
from argosy.core.errors import ArgosyError

FULL = torch.arange(64 * 8, dtype=torch.float32).reshape(64, 8)


def _state(mesh, fill: float | None = None) -> dict:
    from torch.distributed.tensor import Shard, distribute_tensor

    full = FULL if fill is None else torch.full_like(FULL, fill)
    rep = torch.ones(3) if fill is None else torch.full((3,), fill)
    return {
        "model": {"sharded": distribute_tensor(full, mesh, [Shard(0)]), "replicated": rep},
        "loop": {"step": 1 if fill is None else -1},
    }


def _worker(rank: int, world: int, init: str, directory: str, job: str) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,))
        with FlashCheckpointer(directory, job_id=job) as ckpt:
            ckpt.save(1, _state(mesh))
            assert ckpt.wait() == 1
            target = _state(mesh, fill=-1.0)
            step, got = ckpt.load(into=target)
            assert (step, ckpt.last_load_source) == (1, "memory")
            local = got["model"]["sharded"].to_local()
            assert torch.equal(local, FULL[rank * 32 : (rank + 1) * 32])
            assert got["loop"]["step"] == 1
            step, plain = ckpt.load()  # no template: the local shard as a plain tensor
            assert torch.equal(plain["model"]["sharded"], local)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_ranks_save_then_one_process_reshards_from_disk(tmp_path, job):
    import torch.multiprocessing as mp

    init = f"file://{tmp_path / 'store'}"
    directory = tmp_path / "ckpt"
    mp.spawn(_worker, args=(2, init, str(directory), job), nprocs=2, join=True)
    step_dir = directory / ckdisk.step_dir_name(1)
    assert sorted(p.name for p in step_dir.iterdir() if p.suffix == ".distcp") == [
        "__0_0.distcp",
        "__1_0.distcp",
    ]
    assert ckdisk.verify(step_dir) == []
    with FlashCheckpointer(directory, job_id=job, prestart=False) as ckpt:
        with pytest.raises(ArgosyError, match="saved by 2 ranks and 1 load it"):
            ckpt.load()
        into = {
            "model": {"sharded": torch.zeros(64, 8), "replicated": torch.zeros(3)},
            "loop": {"step": -1},
        }
        step, got = ckpt.load(into=into)
    assert step == 1 and ckpt.last_load_source == "disk"
    assert torch.equal(got["model"]["sharded"], FULL)
    assert torch.equal(got["model"]["replicated"], torch.ones(3))
    assert got["loop"]["step"] == 1


def _one_rank_fails(rank: int, world: int, init: str, directory: str, job: str) -> None:
    import resource
    import signal

    import torch.distributed as dist

    from argosy.checkpoint import CheckpointError

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # inherited: oversized writes fail (EFBIG)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        state = {"w": torch.full((1 << 20,), float(rank))}  # 4 MiB per rank
        with FlashCheckpointer(directory, job_id=job) as ckpt:
            ckpt.save(1, state)
            assert ckpt.wait() == 1
            if rank == 1:  # rank 1's disk fills up: its persister may write 1 MiB files
                resource.prlimit(ckpt._proc.pid, resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
            state["w"].add_(1)
            ckpt.save(2, state)
            with pytest.raises(CheckpointError, match="step 2"):
                ckpt.wait()  # raised on both ranks, after both got there
            step, got = ckpt.load()
            assert step == 2 and ckpt.last_load_source == "memory"  # still in memory
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_a_failed_persist_of_one_rank_aborts_the_step_for_all(tmp_path, job):
    import torch.multiprocessing as mp

    init = f"file://{tmp_path / 'store'}"
    directory = tmp_path / "ckpt"
    mp.spawn(_one_rank_fails, args=(2, init, str(directory), job), nprocs=2, join=True)
    assert ckdisk.committed_steps(directory) == [1]  # the previous commit stays the newest
    assert ckdisk.verify(directory / ckdisk.step_dir_name(1)) == []
    assert not [p for p in directory.iterdir() if p.name.startswith(".tmp-")]
