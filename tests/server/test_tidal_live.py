"""The tidal lease end to end on real processes: a real `argosy server` (local executor,
two one-slot nodes), the real `argosy serve` with smollm2-135m as a tidal service and
`examples/train_elastic.py` as an elastic job, over a day compressed into 120 s.

At the trough the replica yields (sleeps), the job grows from 1 to 2 ranks through its
checkpoint and keeps counting steps; before the peak the job shrinks back to 1 rank, the
replica wakes and answers a chat request before the peak starts.
"""

from __future__ import annotations

import math
import re
import signal
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_helpers import ServerProcess

from argosy.executors.local import kill_leftovers

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
STEP_S = 5.0
PERIOD_S = 120.0
"""The trough must hold the replica's start (46-65 s from submit at load 5-9 on 2 cores),
the job's regrowth onto its device (7-16 s) and some training before the shrink at
PERIOD_S - LEAD_S (95 s); at 150 s the test waited out some 70 s of idle trough."""
PEAK_STEPS = 6  # the first 30 s of each period
LEAD_S = 25.0
CONFIG = REPO / "examples" / "tidal_server.yaml"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    proc = ServerProcess(tmp_path / "home", "--config", str(CONFIG))
    proc.start()
    yield proc
    proc.proc.send_signal(signal.SIGTERM)
    proc.proc.wait(timeout=30)
    kill_leftovers(proc.home / "runs")  # replicas and jobs outlive their server


def wait_event(client: httpx.Client, owner: str, kind: str, after: int = 0, timeout_s: float = 240):
    """The first event `kind` of `owner` with a sequence number above `after`."""
    deadline = time.monotonic() + timeout_s
    while True:
        kinds = _events(client, owner)
        for e in kinds:
            if e["kind"] == kind and e["seq"] > after:
                return e
        assert time.monotonic() < deadline, f"no {kind} of {owner}: {[k['kind'] for k in kinds]}"
        time.sleep(0.5)


def _events(client: httpx.Client, owner: str) -> list[dict[str, Any]]:
    path = "services" if owner.startswith("s") else "jobs"
    return client.get(f"/api/v1/{path}/{owner}/events", params={"limit": 500}).json()["items"]


def test_a_service_lends_its_device_to_training_over_a_compressed_day(
    server: ServerProcess,
) -> None:
    client = server.client()
    t0 = math.ceil((time.time() + 1.0) / STEP_S) * STEP_S  # the period starts here
    levels = [1.0] * PEAK_STEPS + [0.0] * (int(PERIOD_S / STEP_S) - PEAK_STEPS)
    tidal = {"levels": levels, "period_s": PERIOD_S, "offset_s": t0 % PERIOD_S}
    tidal |= {"lead_s": LEAD_S, "sleep_level": 1}
    service = {"name": "chat", "replicas": 1, "speculative": "off", "threads": 1, "tidal": tidal}
    sid = client.post("/api/v1/services", json=service).json()["id"]
    job = {
        "name": "train",
        "script": str(REPO / "examples" / "train_elastic.py"),
        "args": ["--steps", "100000", "--step-s", "0.2", "--ckpt-every", "20"],
        "workdir": str(REPO),
        "elastic": {"min_nnodes": 1, "max_nnodes": 2},
    }
    jid = client.post("/api/v1/jobs", json=job).json()["id"]
    peak_s = t0 + PERIOD_S

    # the trough: the replica yields, the job grows onto its device and keeps training
    wait_event(client, sid, "replica_ready", timeout_s=120)
    yielded = wait_event(client, sid, "yield")
    assert "asleep in" in yielded["message"]
    grown = wait_event(client, jid, "resized", after=yielded["seq"])
    assert "now 2 devices" in grown["message"], grown
    assert len(client.get(f"/api/v1/jobs/{jid}").json()["placement"]["nodes"]) == 2
    assert _lost_steps(grown["message"]) <= 20  # at most one checkpoint interval

    # before the peak: the job shrinks, the replica wakes and answers before the peak
    shrink = wait_event(client, jid, "resize", after=grown["seq"])
    assert "shrink 2 -> 1" in shrink["message"], shrink
    reclaimed = wait_event(client, sid, "reclaim", after=shrink["seq"])
    data = client.get(f"/api/v1/services/{sid}").json()
    chat = {
        "model": "smollm2-135m",
        "max_tokens": 4,
        "messages": [{"role": "user", "content": "Hi"}],
    }
    auth = {
        "Authorization": f"Bearer {client.get(f'/api/v1/services/{sid}/key').json()['api_key']}"
    }
    url = f"{data['endpoints'][0]}/chat/completions"
    answer = httpx.post(url, json=chat, headers=auth, timeout=60).json()
    assert answer["choices"][0]["message"]["content"]
    assert time.time() < peak_s, f"answered {time.time() - peak_s:.1f} s after the peak began"
    assert datetime.fromisoformat(reclaimed["created_at"]).timestamp() < peak_s
    shrunk = wait_event(client, jid, "resized", after=shrink["seq"])
    assert "now 1 devices" in shrunk["message"], shrunk
    assert _lost_steps(shrunk["message"]) <= 20
    assert _resumed_step(shrunk["message"]) > _resumed_step(grown["message"])  # it trained
    metrics = client.get("/metrics").text
    assert 'argosy_tidal_transitions_total{kind="yield"} 1.0' in metrics
    assert 'argosy_tidal_transitions_total{kind="reclaim"} 1.0' in metrics


def _lost_steps(message: str) -> int:
    found = re.search(r"(\d+) step\(s\) lost", message)
    assert found, message
    return int(found.group(1))


def _resumed_step(message: str) -> int:
    found = re.search(r"resumed at step (\d+)", message)
    assert found, message
    return int(found.group(1))
