"""Root of the test tree: its presence puts `tests/` on the import path (pytest's prepend
mode), so every test folder can import the shared helpers, e.g. `from cli_helpers import argosy`.

Under `pytest -n N` (xdist's default `load` distribution) the modules in SHARED_SETUP run
whole on one worker, so that their module-scoped fixtures (a pair of real launches, a
server process, a loaded model, a Ray cluster) start once instead of once per worker.
Every other test is handed out one at a time, as `load` does, the `slow`-marked ones
first, so that the run ends on short tests and both workers end together.

Every test runs beside two bystanders, children of the pytest process that no test
started (one in its process group, one in a session of its own, as a browser's driver
and the browser are): a test that kills them fails there, instead of a later test
failing on a dead browser or server another test had started. (xdist's own
`xdist_group` mark cannot do this under pytest 9: it renames test ids through an attribute
pytest 9 no longer reads, so marked tests still spread over the workers.)
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

SHARED_SETUP = frozenset(
    {
        "tests/checkpoint/test_ckpt_cli.py",
        "tests/checkpoint/test_ckpt_faults.py",
        "tests/checkpoint/test_ckpt_flash.py",
        "tests/console/test_console_browser.py",
        "tests/console/test_console_guards.py",
        "tests/console/test_console_pages.py",
        "tests/executors/test_ray_executor.py",
        "tests/executors/test_ray_fake.py",
        "tests/mixed/test_mixed_launch.py",
        "tests/planner/test_calibration.py",
        "tests/runtime/test_launch.py",
        "tests/server/test_attack_corpus.py",
        "tests/server/test_server_cli.py",
        "tests/server/test_server_guards.py",
        "tests/server/test_server_schema.py",
        "tests/server/test_server_stateful.py",
        "tests/server/test_tenant_escape.py",
        "tests/serving/test_serving_api.py",
        "tests/serving/test_serving_batch_speculation.py",
        "tests/serving/test_serving_batching.py",
        "tests/serving/test_serving_contract.py",
        "tests/serving/test_serving_decoding.py",
        "tests/serving/test_serving_draft_training.py",
        "tests/serving/test_serving_engine.py",
        "tests/serving/test_serving_memory_budget.py",
        "tests/serving/test_serving_sleep.py",
        "tests/serving/test_serving_worker.py",
        "tests/sim/test_sim_engine.py",
    }
)
"""Test modules whose module- or session-scoped fixtures start processes, load a model or
run a long computation; add a module here when it gains such a fixture."""

SHARED_TOGETHER = {
    "tests/executors/test_ray_executor.py": "tests/executors (one Ray cluster)",
    "tests/executors/test_ray_fake.py": "tests/executors (one Ray cluster)",
}
"""Modules of SHARED_SETUP that share one process or cluster (tests/executors/conftest.py):
one unit of work for all modules under the same name, run in a row on one worker, so it
starts once."""


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On an xdist worker under `--dist load`: the `slow`-marked tests of modules outside
    SHARED_SETUP move ahead of the other tests outside it (a stable sort: the rest keeps
    its order). The controller queues single tests in the workers' collection order, so
    a long test no longer starts last, with the other worker idle until it ends. A worker
    runs what the controller sends, so this order is only the queue's; a run without
    xdist keeps the collection order."""
    if not getattr(config, "workerinput", {}).get("slow_first"):
        return

    def queued_late(item: pytest.Item) -> bool:
        shared = item.nodeid.split("::", 1)[0] in SHARED_SETUP
        return not shared and item.get_closest_marker("slow") is None

    items.sort(key=queued_late)


@pytest.hookimpl(optionalhook=True)  # a run without xdist has no such hook
def pytest_configure_node(node: Any) -> None:
    """Tell each worker whether the run is `--dist load` (a worker's own `dist` reads
    "no"), for pytest_collection_modifyitems above."""
    node.workerinput["slow_first"] = node.config.getvalue("dist") == "load"


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: Any, log: Any) -> Any:
    """For `--dist load` (what `-n N` gives): a module of SHARED_SETUP is one unit of work,
    any other test is a unit by itself. Units go out largest first, so the long shared
    setups start early and the single tests fill in behind them."""
    if config.getvalue("dist") != "load":
        return None  # an explicit --dist choice stands
    from xdist.scheduler import LoadScopeScheduling

    class SharedSetupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            if module in SHARED_TOGETHER:
                return SHARED_TOGETHER[module]
            return module if module in SHARED_SETUP else nodeid

    return SharedSetupScheduling(config, log)


@pytest.fixture(scope="session")
def _bystanders() -> Iterator[list[subprocess.Popen]]:
    """Two idle children of this pytest process: in its process group, in a session of
    their own."""
    procs = [_bystander(False), _bystander(True)]
    yield procs
    for proc in procs:
        proc.kill()
        proc.wait()


def _bystander(own_session: bool) -> subprocess.Popen:
    return subprocess.Popen(["sleep", "10000000"], start_new_session=own_session)


@pytest.fixture(autouse=True)
def _kills_no_bystander(_bystanders: list[subprocess.Popen]) -> Iterator[None]:
    """Fail the test that killed a process it did not start (and start a new one)."""
    yield
    dead = [(i, p.returncode) for i, p in enumerate(_bystanders) if p.poll() is not None]
    for i, _ in dead:
        _bystanders[i] = _bystander(own_session=i == 1)
    if dead:
        codes = ", ".join(str(code) for _, code in dead)
        pytest.fail(f"this test killed children of pytest it did not start (exit {codes})")
