"""The local executor on a GPU host (discovery faked: eight H100s): each attempt sees only
its own devices, a server restart keeps who holds what, and a busy device is refused."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest

from argosy.executors import local
from argosy.executors.base import LaunchRequest
from argosy.executors.device_book import DevicesBusyError
from argosy.executors.local import LocalExecutor, LocalOptions
from argosy.executors.local_devices import DEVICES_FILE, LocalDevices
from argosy.hardware.backends.base import Device
from tests.executors.launch_requests import command_request

pytestmark = pytest.mark.integration

SHOW = 'echo "${CUDA_VISIBLE_DEVICES-unset} ${ROCR_VISIBLE_DEVICES-unset}" > "$0/seen"; sleep "$1"'


def gpus(count: int, chip: str = "h100-sxm", backend: str = "cuda", first: int = 0) -> list[Device]:
    return [Device(backend, first + i, "GPU", 80.0, chip) for i in range(count)]


@pytest.fixture
def eight_h100(monkeypatch: pytest.MonkeyPatch) -> LocalExecutor:
    monkeypatch.setattr(local, "discover", lambda: gpus(8))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return LocalExecutor(LocalOptions())


def showing(tmp_path: Path, job_id: str, devices: int, seconds: float) -> LaunchRequest:
    """An attempt on `devices` GPUs of this host that writes what it sees to `seen`."""
    req = command_request(
        tmp_path, job_id, ("sh", "-c", SHOW, str(tmp_path / job_id), str(seconds))
    )
    (tmp_path / job_id).mkdir()
    host = local.socket.gethostname()
    return dataclasses.replace(req, nodes={host: devices}, chip="h100-sxm")


def seen(tmp_path: Path, job_id: str) -> str:
    path = tmp_path / job_id / "seen"
    deadline = time.monotonic() + 30
    while not (path.exists() and path.read_text().strip()):
        assert time.monotonic() < deadline, f"{job_id} never wrote what it sees"
        time.sleep(0.05)
    return path.read_text().split()[0]


def test_two_jobs_on_one_gpu_host_see_disjoint_devices(
    tmp_path: Path, eight_h100: LocalExecutor
) -> None:
    executor = eight_h100
    (node,) = executor.inventory()
    assert (node.chip, node.devices) == ("h100-sxm", 8)
    executor.start(showing(tmp_path, "j1", 4, 30))
    executor.start(showing(tmp_path, "j2", 3, 30))
    assert seen(tmp_path, "j1") == "0,1,2,3"
    assert seen(tmp_path, "j2") == "4,5,6"
    assert executor.devices_of("j2") == "CUDA_VISIBLE_DEVICES=4,5,6"  # what events show
    assert not executor.devices_busy({node.name: 1})
    assert executor.devices_busy({node.name: 2})
    with pytest.raises(DevicesBusyError, match="2 device"):
        executor.start(showing(tmp_path, "j3", 2, 30))
    executor.stop("j1")
    executor.stop("j2")
    _wait_ended(executor, 2)
    assert not executor.devices_busy({node.name: 8})  # ends give the devices back
    assert executor.devices_of("j1") == ""


def test_a_restarted_server_keeps_who_holds_which_device(
    tmp_path: Path, eight_h100: LocalExecutor
) -> None:
    first = eight_h100
    req = showing(tmp_path, "j1", 5, 30)
    first.start(req)
    assert seen(tmp_path, "j1") == "0,1,2,3,4"
    second = LocalExecutor(LocalOptions())  # the same faked discovery
    assert second.adopt("j1", 1, req.run_dir) is None
    second.start(showing(tmp_path, "j2", 3, 0))
    assert seen(tmp_path, "j2") == "5,6,7"  # not the adopted attempt's devices
    second.stop("j1")
    _wait_ended(second, 2)
    first.poll()


def test_a_server_narrowed_to_some_gpus_gives_out_those(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(local, "discover", lambda: gpus(3))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-a,GPU-b,GPU-c")
    executor = LocalExecutor(LocalOptions())
    executor.start(showing(tmp_path, "j1", 1, 0))
    executor.start(showing(tmp_path, "j2", 2, 0))
    assert (seen(tmp_path, "j1"), seen(tmp_path, "j2")) == ("GPU-a", "GPU-b,GPU-c")
    _wait_ended(executor, 2)


def test_rocm_devices_are_narrowed_at_the_lowest_layer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(local, "discover", lambda: gpus(4, "mi300x", "rocm"))
    executor = LocalExecutor(LocalOptions())
    executor.start(showing(tmp_path, "j1", 2, 0))
    path = tmp_path / "j1" / "seen"
    seen(tmp_path, "j1")
    assert path.read_text().split() == ["unset", "0,1"]
    _wait_ended(executor, 1)


def test_cpu_slots_narrow_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(local, "discover", lambda: [])
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    executor = LocalExecutor(LocalOptions(slots=2))
    req = showing(tmp_path, "j1", 1, 0)
    (node,) = executor.inventory()
    executor.start(dataclasses.replace(req, nodes={node.name: 2}, chip="cpu"))
    assert seen(tmp_path, "j1") == "unset"
    assert not executor.devices_busy({node.name: 2})
    _wait_ended(executor, 1)


def test_two_chip_types_are_two_nodes_with_their_own_indices(tmp_path: Path) -> None:
    found = gpus(2, "h100-sxm") + gpus(2, "a100-sxm-80gb", first=2)
    devices = LocalDevices("host", 0, 0, lambda: found)
    assert sorted((n.name, n.devices) for n in devices.inventory()) == [
        ("host-a100-sxm-80gb", 2),
        ("host-h100-sxm", 2),
    ]
    where = tmp_path / "a1"
    where.mkdir()
    env = devices.take("j1", {"host-a100-sxm-80gb": 1, "host-h100-sxm": 2}, where)
    assert env == {"CUDA_VISIBLE_DEVICES": "0,1,2"}
    assert (where / DEVICES_FILE).exists()


def _wait_ended(executor: LocalExecutor, count: int) -> None:
    ended, deadline = 0, time.monotonic() + 60
    while ended < count:
        assert time.monotonic() < deadline, "attempts did not end"
        ended += len(executor.poll())
        time.sleep(0.05)


@pytest.mark.parametrize(
    ("node_devices", "sizes"), [(0, [8]), (1, [1] * 8), (3, [3, 3, 2]), (8, [8])]
)
def test_gpus_split_into_nodes_give_each_node_its_own_indices(
    tmp_path: Path, node_devices: int, sizes: list[int]
) -> None:
    """`node_devices` splits a GPU host as it splits CPU slots (the scheduler resizes and
    lends whole nodes): node i holds the next indices, and a placement over several of
    them sees exactly theirs."""
    devices = LocalDevices("host", 0, node_devices, lambda: gpus(8))
    nodes = devices.inventory()
    assert [n.devices for n in nodes] == sizes
    names = [n.name for n in nodes]
    assert names == (["host"] if len(sizes) == 1 else [f"host-{i}" for i in range(len(sizes))])
    wanted = {names[-1]: 1} if len(names) == 1 else {names[0]: 1, names[-1]: sizes[-1]}
    where = tmp_path / "a"
    where.mkdir()
    env = devices.take("j1", wanted, where)
    first_of_last = 8 - sizes[-1]
    want = [0, *range(first_of_last, 8)] if len(names) > 1 else [0]
    assert env == {"CUDA_VISIBLE_DEVICES": ",".join(map(str, want))}
