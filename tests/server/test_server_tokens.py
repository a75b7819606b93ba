"""Token lifecycle through the REST API on a real store: create (with expiry), list,
revoke; revoked and expired tokens are refused at once, also after they were cached;
no raw token reaches the database file; a token made before salts still works and is
hashed again with a salt; events name who created and revoked tokens."""

from __future__ import annotations

import hashlib
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from server_helpers import fast_config

from argosy.executors.base import NodeInfo
from argosy.executors.fake import FakeExecutor
from argosy.server.app import create_app
from argosy.server.auth import TOKEN_FORMAT

NODES = [NodeInfo("n0", "cpu", 2)]


@pytest.fixture
def api(home: Path) -> Iterator[TestClient]:
    with TestClient(create_app(fast_config(home), executor=FakeExecutor(NODES))) as c:
        c.headers["Authorization"] = f"Bearer {(home / 'admin.token').read_text().strip()}"
        yield c


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def create(api: TestClient, **body: object) -> dict:
    r = api.post("/api/v1/tokens", json={"queue": "default"} | body)
    assert r.status_code == 201, r.text
    return r.json()


def listed(api: TestClient) -> dict[str, dict]:
    r = api.get("/api/v1/tokens")
    assert r.status_code == 200, r.text
    return {t["id"]: t for t in r.json()}


def test_a_token_is_created_with_an_id_listed_without_secrets_and_revoked(
    api: TestClient,
) -> None:
    made = create(api, name="ci", expires="30d")
    assert made["token"].startswith(f"argosy_{made['id']}_")
    assert made["queue"] == "default" and made["name"] == "ci" and made["expires_at"]
    assert api.get("/api/v1/jobs", headers=bearer(made["token"])).status_code == 200
    row = listed(api)[made["id"]]
    assert row["state"] == "active" and row["created_by"] == "admin"
    assert row["revoked_at"] is None and row["expires_at"] == made["expires_at"]
    body = api.get("/api/v1/tokens").text
    secret = made["token"].removeprefix(f"argosy_{made['id']}_")  # may itself hold "_"
    assert secret not in body and '"hash"' not in body and '"salt"' not in body
    r = api.delete(f"/api/v1/tokens/{made['id']}")
    assert r.status_code == 200 and r.json()["state"] == "revoked" and r.json()["revoked_at"]
    assert listed(api)[made["id"]]["state"] == "revoked"
    assert api.delete(f"/api/v1/tokens/{made['id']}").status_code == 200  # again: a no-op


def test_a_revoked_token_is_refused_at_once_even_after_it_was_cached(api: TestClient) -> None:
    made = create(api, name="cached")
    for _ in range(3):  # looked up, verified, cached
        assert api.get("/api/v1/queues", headers=bearer(made["token"])).status_code == 200
    assert api.delete(f"/api/v1/tokens/{made['id']}").status_code == 200
    assert api.get("/api/v1/queues", headers=bearer(made["token"])).status_code == 401
    assert api.get("/api/v1/queues", headers=bearer(made["token"])).status_code == 401


def test_an_expired_token_is_refused_at_once_even_after_it_was_cached(api: TestClient) -> None:
    made = create(api, expires_in_s=0.5)
    assert api.get("/api/v1/queues", headers=bearer(made["token"])).status_code == 200
    time.sleep(0.6)
    assert api.get("/api/v1/queues", headers=bearer(made["token"])).status_code == 401
    assert listed(api)[made["id"]]["state"] == "expired"


@pytest.mark.parametrize(
    ("body", "want_field"),
    [
        ({"expires": "0d"}, "expires"),
        ({"expires": "30x"}, "expires"),
        ({"expires": "99999999d"}, "expires"),
        ({"expires_in_s": -5}, "expires_in_s"),
        ({"expires_in_s": 0}, "expires_in_s"),
        ({"expires_in_s": 1e12}, "expires_in_s"),
        ({"expires_in_s": True}, "expires_in_s"),
        ({"expires_in_s": "60"}, "expires_in_s"),
        ({"expires": "1d", "expires_in_s": 60}, "expires_in_s"),
        ({"name": "a\nb"}, "name"),
    ],
    ids=[
        "zero",
        "bad-unit",
        "too-long-duration",
        "negative",
        "zero-seconds",
        "too-many-seconds",
        "bool",
        "string-seconds",
        "both",
        "newline-name",
    ],
)
def test_bad_token_requests_are_422_naming_the_field(
    api: TestClient, body: dict, want_field: str
) -> None:
    r = api.post("/api/v1/tokens", json={"queue": "default"} | body)
    assert r.status_code == 422, r.text
    assert want_field in r.text


def test_only_admins_manage_tokens_and_the_servers_own_token_cannot_be_revoked(
    api: TestClient,
) -> None:
    user = bearer(create(api)["token"])
    assert api.get("/api/v1/tokens", headers=user).status_code == 403
    assert api.post("/api/v1/tokens", json={}, headers=user).status_code == 403
    assert api.delete("/api/v1/tokens/tnothere", headers=user).status_code == 403
    assert api.delete("/api/v1/tokens/tnothere").status_code == 404
    server_token = next(t for t in listed(api).values() if t["created_by"] == "server")
    r = api.delete(f"/api/v1/tokens/{server_token['id']}")
    assert r.status_code == 409 and "admin.token" in r.json()["detail"]
    assert api.get("/api/v1/tokens").status_code == 200  # still works


def test_an_admin_token_made_through_the_api_acts_under_its_own_id(api: TestClient) -> None:
    made = create(api, queue=None, name="ops")
    r = api.post("/api/v1/nodes/n0/cordon", headers=bearer(made["token"]))
    assert r.status_code == 200
    events = api.get("/api/v1/events").json()["items"]
    cordoned = next(e for e in events if e["kind"] == "cordoned")
    assert cordoned["actor"] == f"token {made['id']} (ops)"
    created = next(e for e in events if e["kind"] == "token_created")
    assert created["actor"] == "admin" and made["id"] in created["message"]


def test_the_database_holds_no_raw_token(api: TestClient, home: Path) -> None:
    made = create(api, name="secret-holder")
    api.get("/api/v1/jobs", headers=bearer(made["token"]))
    admin = (home / "admin.token").read_text().strip()
    secrets = [
        made["token"],
        admin,
        *(TOKEN_FORMAT.fullmatch(t)[2] for t in (made["token"], admin)),
    ]
    files = [p for p in home.glob("argosy.db*") if p.is_file()]
    data = b"".join(p.read_bytes() for p in files)
    assert made["id"].encode() in data  # the bytes read are the store's
    for secret in secrets:
        assert secret.encode() not in data
        assert hashlib.sha256(secret.encode()).hexdigest().encode() not in data  # unsalted


def test_a_token_made_before_salts_still_works_and_is_hashed_again(tmp_path: Path) -> None:
    """A store at revision 0003 with a token row as the old code wrote it (unsalted
    sha256 of the whole token), and an admin.token of the old format."""
    home = tmp_path / "home"
    home.mkdir()
    db = home / "argosy.db"
    old_token, old_admin = "argosy_" + "u" * 43, "argosy_" + "a" * 43
    _old_store(db, {old_token: "team", old_admin: None})
    (home / "admin.token").write_text(old_admin + "\n")
    with TestClient(create_app(fast_config(home), executor=FakeExecutor(NODES))) as api:
        assert api.get("/api/v1/queues", headers=bearer(old_admin)).status_code == 200
        api.headers.update(bearer(old_admin))
        assert api.get("/api/v1/jobs", headers=bearer(old_token)).status_code == 200
        rows = {r["id"]: r for r in _rows(db)}
        old_id = "t" + hashlib.sha256(old_token.encode()).hexdigest()[:12]
        assert rows[old_id]["salt"] and rows[old_id]["hash"] != _sha(old_token)
        admin_id = "t" + _sha(old_admin)[:12]
        assert rows[admin_id]["salt"] and rows[admin_id]["created_by"] == "server"
        assert api.get("/api/v1/jobs", headers=bearer(old_token)).status_code == 200
        assert api.get("/api/v1/jobs", headers=bearer("argosy_" + "v" * 43)).status_code == 401
    with TestClient(create_app(fast_config(home), executor=FakeExecutor(NODES))) as api:
        assert api.get("/api/v1/jobs", headers=bearer(old_token)).status_code == 200  # uncached


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _old_store(db: Path, tokens: dict[str, str | None]) -> None:
    from alembic import command
    from alembic.config import Config
    from sqlalchemy import create_engine

    import argosy.server.store as store_module

    engine = create_engine(f"sqlite:///{db}")
    config = Config()
    config.set_main_option(
        "script_location", str(Path(store_module.__file__).parent / "migrations")
    )
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "0003")
    engine.dispose()
    with sqlite3.connect(db) as c:  # the old Store.add_token's row
        for token, queue in tokens.items():
            c.execute(
                "INSERT INTO tokens (hash, queue, name, created_at) VALUES (?, ?, ?, ?)",
                (_sha(token), queue, "old", time.time()),
            )


def _rows(db: Path) -> list[dict]:
    with sqlite3.connect(db) as c:
        c.row_factory = sqlite3.Row
        return [dict(r) for r in c.execute("SELECT * FROM tokens")]
