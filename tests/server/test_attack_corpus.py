"""A corpus of attacks and bad inputs against one real `argosy server` (issue 31's target:
0 escapes, 0 5xx, 0 lost or changed data, each refusal clear).

The server has two tenant queues, team-a and team-b, with a token and a console session
each, besides the admin's. Each case of the table (attack_cases.py: tenant escapes,
CSRF and credentials, oversized input, type confusion, unicode, traversal, unknown
enums, pagination, auth headers) sends its request as one principal and states what
must come back: the status, and what the answer must say (the field or the limit it
names). After every case, whatever it was, the server must not have answered 5xx,
logged a traceback, or stored or changed anything (jobs, services, tokens, nodes and
simulator reports, compared before and after), and must still be healthy. A few cases
are inputs the server accepts: they add exactly one job, stored as sent.

Reads of states are open by design (docs/server.md: any token reads every queue's
jobs, services, events, queues and nodes), so team-a reading team-b's job is a 200; a
job's or service's output (its logs, where tenants print their data) is its queue's and
the admins' only, so team-a reading team-b's logs is a 403.

Two hypothesis property tests send random JSON to POST /api/v1/jobs and
/api/v1/services with a queue token: never a 5xx, and any 201 stored what was sent.
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from attack_cases import CORPUS, JOB, JOB_INTS, SERVICE, SERVICE_INTS, SERVICE_STRS, Attack
from attack_helpers import World, build_world, healthy, sessions_alive, snapshot
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    w = build_world(tmp_path_factory.mktemp("attack"))
    yield w
    for client, _ in w.browsers.values():
        client.close()
    if w.admin is not None:
        w.admin.close()
    w.server.kill()


@pytest.mark.parametrize("attack", CORPUS)
def test_attack_is_refused_clearly_and_changes_nothing(world: World, attack: Attack) -> None:
    before, log_before = snapshot(world), len(world.log_text())
    answer = attack.send(world)
    want = attack.want if isinstance(attack.want, tuple) else (attack.want,)
    assert answer.status in want, (answer.status, answer.text[:500])
    text = html.unescape(answer.text).lower()  # console pages escape quotes
    for says in attack.says:
        assert says.lower() in text, (says, answer.text[-800:])
    if answer.status >= 400:
        assert len(answer.text) < 20_000, "a refusal echoes its input"
    assert world.tokens["admin"] not in answer.text
    after = snapshot(world)
    if attack.sent is not None:  # an accepted input: one new job, stored as sent
        added = [j for j in after["jobs"] if j not in before["jobs"]]
        assert len(added) == 1 and after | {"jobs": before["jobs"]} == before, added
        assert {k: added[0][3][k] for k in attack.sent} == attack.sent
    else:
        assert after == before
    assert healthy(world)
    new_log = world.log_text()[log_before:]
    assert "Traceback" not in new_log and "Exception in ASGI" not in new_log, new_log[-3000:]
    if "log" in attack.name:  # login, logout: the sessions outlive them
        assert sessions_alive(world) == list(world.browsers)


def test_every_console_session_outlived_the_corpus(world: World) -> None:
    assert sessions_alive(world) == list(world.browsers)


def test_the_corpus_is_large_and_each_name_unique() -> None:
    names = [p.values[0].name for p in CORPUS]
    assert len(names) == len(set(names))
    assert len(names) >= 300


# ---- property: random JSON bodies ----------------------------------------------------------
TEXT = st.text(st.characters(codec=None), max_size=12)  # surrogates and NUL included
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=12,
)
JOB_KEYS = [*JOB, "args", *JOB_INTS, "chips", "inject", "elastic", "bogus"]
SERVICE_KEYS = [*SERVICE, *SERVICE_INTS, *SERVICE_STRS, "chips", "memory_fraction", "tidal"]
PROPERTY = settings(
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def bodies(base: dict, keys: list[str]) -> st.SearchStrategy:
    """A valid body with a few keys dropped or set to any JSON; or any JSON at all."""
    edits = st.dictionaries(st.sampled_from(keys) | TEXT, JSON | st.just("DROP"), max_size=3)
    edited = edits.map(lambda e: {k: v for k, v in (base | e).items() if v != "DROP"})
    return st.one_of(edited, edited, JSON)


def as_text(value: Any) -> Any:
    """What `args` stores: numbers become their text (JobSpec's documented convenience)."""
    if not isinstance(value, list):
        return value
    return [str(v) if isinstance(v, int | float) and not isinstance(v, bool) else v for v in value]


@settings(PROPERTY, max_examples=50)
@given(body=bodies(JOB, JOB_KEYS))
def test_random_job_bodies_never_5xx_and_201_stores_what_was_sent(world: World, body: Any) -> None:
    check_stored(world, "/api/v1/jobs", body)


@settings(PROPERTY, max_examples=30)
@given(body=bodies(SERVICE, SERVICE_KEYS))
def test_random_service_bodies_never_5xx_and_201_stores_what_was_sent(
    world: World, body: Any
) -> None:
    check_stored(world, "/api/v1/services", body)


def check_stored(world: World, path: str, body: Any) -> None:
    """POST `body` as JSON (NaN and infinity as Python writes them); a 201 must have stored
    each sent key's value unchanged (an int for a float field aside: the same number)."""
    token = world.tokens["team-a"]
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    with httpx.Client(base_url=world.url, timeout=60) as c:
        r = c.post(path, content=json.dumps(body).encode(), headers=headers)
        event(f"status {r.status_code}")
        assert r.status_code < 500, (body, r.text[:500])
        if r.status_code != 201:
            assert r.status_code in (403, 422), (r.status_code, r.text[:300])
            return
        stored = c.get(f"{path}/{r.json()['id']}", headers=headers)
        assert stored.status_code == 200, stored.text[:300]
        spec = stored.json()["spec"]
    for key, value in body.items():
        want = as_text(value) if key == "args" else value
        assert spec[key] == want, (key, value, spec[key])
        assert type(spec[key]) is type(want) or key in ("memory_fraction", "tidal"), key
