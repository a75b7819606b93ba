"""A large job YAML posted to the console is parsed off the event loop: the server keeps
answering other requests (every tenant's) while it is read."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import httpx
from console_helpers import login_client

from argosy.cli.demo import server_process
from argosy.core.net import free_port


def big_job_yaml() -> str:
    """A job file near both console caps: 99 KB of text (the form field's 100,000
    characters) whose aliases expand to about 99,000 values (the loader's 100,000)."""
    flat = ", ".join(["a"] * 30_000)
    pad = ", ".join(["a"] * 1_000)
    aliases = ", ".join(["*p"] * 68)
    head = "name: big\nqueue: default\nscript: /bin/true\n"
    return head + f"pad: &p [{pad}]\nmore: [{aliases}]\nargs: [{flat}]\n"


def test_health_answers_while_a_big_job_yaml_is_parsed(tmp_path: Path) -> None:
    home = tmp_path / "home"
    root_jobs = ("--allow-root-jobs",) if os.geteuid() == 0 else ()
    with server_process(home, free_port(), slots=1, extra=root_jobs) as url:
        admin_token = (home / "admin.token").read_text().strip()
        _check(url, admin_token)


def _check(url: str, admin_token: str) -> None:
    finished: list[str] = []
    with httpx.Client(base_url=url, timeout=120) as client:
        csrf = login_client(client, admin_token)

        def submit() -> None:
            r = client.post("/submit", data={"csrf": csrf, "yaml": big_job_yaml()})
            assert r.status_code < 500, r.text[:300]
            finished.append("submit")

        worker = threading.Thread(target=submit)
        started = time.monotonic()
        worker.start()
        time.sleep(0.15)  # the body is on its way; reading it takes about a second
        with httpx.Client(base_url=url, timeout=120) as other:
            assert other.get("/api/v1/health").status_code == 200
        finished.append("health")
        worker.join(120)
    took = time.monotonic() - started
    assert finished == ["health", "submit"], (finished, took)
