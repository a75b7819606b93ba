"""A job's `inject` faults reach `argosy launch` of its first attempt only, and a
malformed one is refused at submit with the field named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from server_helpers import TERMINAL, wait_for

TRAIN = Path(__file__).resolve().parents[2] / "examples" / "train_gpt.py"


def test_an_injected_kill_is_survived_and_recorded(client: TestClient) -> None:
    body = {
        "name": "rehearse",
        "script": str(TRAIN),
        "args": ["--steps", "8", "--ckpt-every", "2"],
        "nproc_per_node": 2,
        "inject": ["kill:rank=1:step=5"],
        "workdir": str(TRAIN.parent),
    }
    r = client.post("/api/v1/jobs", json=body)
    assert r.status_code == 201, r.text
    done = wait_for(client, r.json()["id"], TERMINAL, timeout_s=240)
    assert done["state"] == "succeeded", done
    assert done["attempts"] == 1  # the runtime restarted the ranks inside the attempt
    summary = done["summary"]
    assert summary["restarts"] == 1
    faults = summary["faults"]
    assert len(faults) == 1 and faults[0]["rank"] == 1, json.dumps(faults)


@pytest.mark.parametrize(
    ("entry", "why"),
    [("explode:rank=0", "injection kind"), ("kill:rank=5:step=2", "rank"), ("kill:step=2", "rank")],
)
def test_a_bad_injection_is_422_naming_the_field(client: TestClient, entry: str, why: str) -> None:
    body = {"name": "bad", "script": str(TRAIN), "nproc_per_node": 2, "inject": [entry]}
    r = client.post("/api/v1/jobs", json=body)
    assert r.status_code == 422, r.text
    assert "inject" in r.text and why in r.text
