"""Fixtures of the browser tests: a real `argosy server` process on a temporary home and a
headless Chromium (Debian's `chromium`, driven by Playwright) logged in to its console.

Screenshots go to `runs/console-screens/` (git-ignored test artifacts)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from console_helpers import login

from argosy.cli.demo import server_process
from argosy.core.net import free_port

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")


def chromium_path() -> str | None:
    return next((p for p in map(shutil.which, CHROMIUM_NAMES) if p), None)


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    home = tmp_path_factory.mktemp("console-home")
    root_jobs = ("--allow-root-jobs",) if os.geteuid() == 0 else ()  # isolation: tests/server
    with server_process(home, free_port(), slots=2, extra=root_jobs) as url:
        yield url, home


@pytest.fixture(scope="session")
def admin_token(server: tuple[str, Path]) -> str:
    return (server[1] / "admin.token").read_text().strip()


@pytest.fixture(scope="session")
def browser() -> Iterator[object]:
    path = chromium_path()
    if path is None:
        pytest.skip("no chromium on this machine (scripts/setup.sh installs it with apt-get)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=path, args=["--no-sandbox", "--disable-gpu"])
        yield b
        b.close()


@pytest.fixture
def page(browser, server, admin_token):  # noqa: ANN001, ANN201
    """A fresh browser context, logged in as admin through the login form."""
    context = browser.new_context(viewport={"width": 1360, "height": 900})
    pg = context.new_page()
    pg.set_default_timeout(30_000)
    login(pg, server[0], admin_token)
    yield pg
    context.close()


@pytest.fixture(scope="session")
def sim_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real `argosy sim run --compare --json` report of a small generated trace."""
    out = tmp_path_factory.mktemp("sim")
    argosy = [sys.executable, "-m", "argosy", "sim"]
    cluster = ["--cluster", "h100-sxm:64"]
    subprocess.run([*argosy, "generate", *cluster, "--days", "0.1", "--out", str(out)], check=True)
    trace = ["--trace", str(out / "trace.jsonl"), "--queues", str(out / "queues.yaml")]
    run = [*argosy, "run", *cluster, *trace, "--compare", "--json", "--plot", str(out / "p.png")]
    report = out / "compare-small.json"
    with report.open("w") as f:
        subprocess.run(run, check=True, stdout=f)
    return report
