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
    """Burst 4: a console login (it writes a session row) and three submits go through;
    then every change of that token is refused, through the API, the console's forms and
    a new login alike, while its reads, another queue's token and the server's admin
    token go on."""
    (tmp_path / "queues.yaml").write_text(QUEUES)
    fake, home = FakeExecutor([NodeInfo("n0", "cpu", 1)]), tmp_path / "home"
    config = fast_config(
        home,
        queues_file=tmp_path / "queues.yaml",
        token_writes_per_s=0.01,  # one change per 100 s: none refills during the test
        token_write_burst=4,
    )
    with TestClient(create_app(config, executor=fake)) as api:
        admin = {"Authorization": f"Bearer {(home / 'admin.token').read_text().strip()}"}
        secrets = {}
        for queue in "ab":
            r = api.post("/api/v1/tokens", json={"queue": queue, "name": queue}, headers=admin)
            secrets[queue] = r.json()["token"]
        a, b = ({"Authorization": f"Bearer {secrets[q]}"} for q in "ab")
        page = api.post("/login", data={"token": secrets["a"]})  # change 1: a session
        assert page.status_code == 200, page.text[:300]
        csrf = re.search(r'name="csrf" value="([^"]+)"', api.get("/submit").text)
        assert csrf is not None
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
        other = api.post("/api/v1/jobs", json=job_body("b0", queue="b"), headers=b)
        assert other.status_code == 201
        for i in range(5):  # the server's own admin token is never limited
            r = api.post("/api/v1/jobs", json=job_body(f"x{i}", queue="a"), headers=admin)
            assert r.status_code == 201
        job = done[1].json()["id"]  # the console's form is the same token's change
        r = api.post(f"/jobs/{job}/cancel", data={"csrf": csrf.group(1)}, follow_redirects=False)
        assert r.status_code == 429, r.text[:300]
        assert api.get(f"/api/v1/jobs/{job}", headers=admin).json()["state"] != "cancelled"
        api.cookies.clear()  # and so is a new login, which would write a session row
        again = api.post("/login", data={"token": secrets["a"]})
        assert again.status_code == 429, again.text[:300]


def test_one_token_holds_at_most_so_many_sessions(tmp_path: Path) -> None:
    """Logging in again and again with one token ends its oldest sessions: the table of
    sessions cannot grow past MAX_PER_TOKEN rows per token, and the newest all work."""
    from argosy.server.sessions import MAX_PER_TOKEN

    config = fast_config(tmp_path / "home", token_writes_per_s=0)
    fake = FakeExecutor([NodeInfo("n0", "cpu", 1)])
    with TestClient(create_app(config, executor=fake)) as api:
        token = (tmp_path / "home" / "admin.token").read_text().strip()
        sessions = api.app.state.sessions
        who = api.app.state.tokens.principal(token)
        ids = [sessions.open(who)[0] for _ in range(MAX_PER_TOKEN + 7)]
        assert all(sessions.get(i) is None for i in ids[:7])
        assert all(sessions.get(i) is not None for i in ids[7:])
        with sessions.store.engine.connect() as c:
            from sqlalchemy import func, select

            from argosy.server.tables import sessions as table

            assert c.execute(select(func.count()).select_from(table)).scalar() == MAX_PER_TOKEN
