"""Fixtures of the executor tests: one real two-node Ray cluster for the Ray modules.

test_ray_executor.py and test_ray_fake.py (its real harness) share it: Ray's start-up
(16-21 s on two loaded cores) and stop are paid once. It stops after the last test of
those modules that runs in a row (or at the session's end), so no idle cluster stays
beside the rest of the run; a later test of theirs would start a new one. Under
`pytest -n N` both modules run on one worker, in a row (tests/conftest.py,
SHARED_TOGETHER). Each module leaves the cluster with a `head` and a `worker` alive: a
killed worker is started again under its label, and a node that joined later (`late`)
is dead, which the executor's inventory leaves out. The cluster asks for Ray's token
(`ray_helpers.TOKEN_AUTH`), which this process's environment carries from here on.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ray_helpers import TOKEN_AUTH, RayCluster

os.environ.update(TOKEN_AUTH)  # before Ray's first import here: it reads its mode once

SHARING = frozenset({"test_ray_executor.py", "test_ray_fake.py"})
_live: list[RayCluster] = []


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory) -> RayCluster:
    """The live shared cluster, started by the first module that asks for it."""
    if not _live:
        _live.append(RayCluster(tmp_path_factory.mktemp("ray")))
    return _live[0]


def _stop_live() -> None:
    if _live:
        import ray

        ray.shutdown()
        _live.pop().stop()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[Any]:
    """After the test's own teardown (a module's server first): the cluster stops unless
    the next test is of a module that shares it."""
    result = yield
    if nextitem is None or nextitem.path.name not in SHARING:
        _stop_live()
    return result


def pytest_sessionfinish(session: pytest.Session) -> None:
    """An interrupted run stops it too."""
    _stop_live()


@pytest.fixture
def open_base() -> Iterator[Path]:
    """A folder under /tmp every user may pass through (pytest's temp root is 0700): for
    run directories and files of job users."""
    base = Path(tempfile.mkdtemp(prefix="argosy-open-", dir="/tmp"))
    os.chmod(base, 0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)
