"""On a real GPU host (skipped without one; `scripts/gpu_check.sh` runs it): the local
executor's device book gives each attempt GPUs of its own, and a process started with the
environment it returns sees exactly those (count and UUIDs), none of another attempt's."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from argosy.executors.local_devices import LocalDevices

SEEN = """\
import json, torch
print(json.dumps([str(torch.cuda.get_device_properties(i).uuid)
                  for i in range(torch.cuda.device_count())]))
"""


def _seen(env: dict[str, str]) -> list[str]:
    """The GPU UUIDs a fresh process with `env` sees."""
    out = subprocess.run(
        [sys.executable, "-c", SEEN],
        env=os.environ | env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.gpu
@pytest.mark.integration
def test_each_attempt_sees_only_its_own_gpus(tmp_path: Path) -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    devices = LocalDevices(socket.gethostname(), 0, 0)
    node = max(devices.inventory(), key=lambda n: n.devices)
    first = (node.devices + 1) // 2
    (tmp_path / "a").mkdir()
    env_a = devices.take("a", {node.name: first}, tmp_path / "a")
    assert set(env_a) == {"CUDA_VISIBLE_DEVICES"}
    seen_a = _seen(env_a)
    assert len(seen_a) == first
    if node.devices > 1:
        (tmp_path / "b").mkdir()
        seen_b = _seen(devices.take("b", {node.name: node.devices - first}, tmp_path / "b"))
        assert len(seen_b) == node.devices - first and not set(seen_a) & set(seen_b)
    assert devices.busy({node.name: 1})  # every GPU is held now
