"""A token's changes are rate limited (`token_writes_per_s`, `token_write_burst`): past
its burst a queue token gets a 429 with Retry-After on every change, through the API
and the console alike, while its reads, other tokens and the server's own admin token
go on; the bucket refills with time. The buckets themselves: a hypothesis property over
any sequence of takes, keys and pauses."""

from __future__ import annotations

import re
from pathlib import Path

from fastapi.testclient import TestClient
from hypothesis import given
from hypothesis import strategies as st
from server_helpers import fast_config, job_body

from argosy.executors.base import NodeInfo
from argosy.executors.fake import FakeExecutor
from argosy.server.app import create_app
from argosy.server.rate_limits import RateLimits

QUEUES = "queues:\n  - name: org\n    children:\n      - name: a\n      - name: b\n"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@given(
    rate=st.floats(0.1, 50.0),
    burst=st.integers(1, 20),
    steps=st.lists(st.tuples(st.sampled_from("xyz"), st.floats(0.0, 2.0)), max_size=200),
)
def test_a_bucket_never_lets_more_than_its_burst_and_rate_through(
    rate: float, burst: int, steps: list[tuple[str, float]]
) -> None:
    """For every key, after every step: changes let through by time t are at most
    burst + rate * t; a refusal names a wait after which the next take succeeds."""
    clock = Clock()
    limits = RateLimits(rate, burst, clock)
    taken = dict.fromkeys("xyz", 0)
    for key, pause in steps:
        clock.now += pause
        wait = limits.wait_s(key)
        if wait == 0.0:
            taken[key] += 1
        else:
            assert 0 < wait <= 1.0 / rate + 1e-9
            clock.now += wait
            assert limits.wait_s(key) == 0.0  # the wait it named was enough
            taken[key] += 1
        for k, n in taken.items():
            assert n <= burst + rate * clock.now + 1e-6, (k, n, clock.now)


def test_a_full_burst_goes_through_at_once_then_one_per_period() -> None:
    clock = Clock()
    limits = RateLimits(2.0, 5, clock)
    assert [limits.wait_s("t") for _ in range(5)] == [0.0] * 5
    assert limits.wait_s("t") == 0.5
    assert limits.wait_s("u") == 0.0  # another token: its own bucket
    clock.now += 0.5
    assert limits.wait_s("t") == 0.0
    assert limits.wait_s("t") == 0.5


def test_a_queue_token_past_its_burst_gets_429_and_others_go_on(tmp_path: Path) -> None:
    (tmp_path / "queues.yaml").write_text(QUEUES)
    fake, home = FakeExecutor([NodeInfo("n0", "cpu", 1)]), tmp_path / "home"
    config = fast_config(
        home,
        queues_file=tmp_path / "queues.yaml",
        token_writes_per_s=0.01,  # one change per 100 s: none refills during the test
        token_write_burst=3,
    )
    with TestClient(create_app(config, executor=fake)) as api:
        admin = {"Authorization": f"Bearer {(home / 'admin.token').read_text().strip()}"}
        tokens = {}
        for queue in "ab":
            r = api.post("/api/v1/tokens", json={"queue": queue, "name": queue}, headers=admin)
            tokens[queue] = {"Authorization": f"Bearer {r.json()['token']}"}
        a = tokens["a"]
        done = [
            api.post("/api/v1/jobs", json=job_body(f"a{i}", queue="a"), headers=a) for i in range(3)
        ]
        assert [r.status_code for r in done] == [201, 201, 201]
        refused = api.post("/api/v1/jobs", json=job_body("a3", queue="a"), headers=a)
        assert refused.status_code == 429, refused.text
        assert int(refused.headers["Retry-After"]) >= 1
        assert "token_writes_per_s" in refused.json()["detail"]
        cancel = api.post(f"/api/v1/jobs/{done[0].json()['id']}/cancel", headers=a)
        assert cancel.status_code == 429  # every change counts, not only submits
        assert api.get("/api/v1/jobs", headers=a).status_code == 200  # reads go on
        assert (
            api.post(
                "/api/v1/jobs", json=job_body("b0", queue="b"), headers=tokens["b"]
            ).status_code
            == 201
        )
        for i in range(5):  # the server's own admin token is never limited
            r = api.post("/api/v1/jobs", json=job_body(f"x{i}", queue="a"), headers=admin)
            assert r.status_code == 201
        # the console is the same token's: a session of it is refused the same way
        page = api.post("/login", data={"token": tokens["a"]["Authorization"][7:]})
        assert page.status_code == 200, page.text[:300]
        csrf = re.search(r'name="csrf" value="([^"]+)"', api.get("/submit").text)
        assert csrf is not None
        job = done[1].json()["id"]
        r = api.post(f"/jobs/{job}/cancel", data={"csrf": csrf.group(1)}, follow_redirects=False)
        assert r.status_code == 429, r.text[:300]
        assert api.get(f"/api/v1/jobs/{job}", headers=admin).json()["state"] != "cancelled"
