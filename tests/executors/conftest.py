"""Fixtures of the executor tests: one real two-node Ray cluster for the session.

test_ray_executor.py and test_ray_fake.py (its real harness) share it: Ray's start-up
(16-21 s on two loaded cores) and stop are paid once. Under `pytest -n N` both modules run
on one worker (tests/conftest.py, SHARED_TOGETHER). Each module leaves the cluster with a
`head` and a `worker` alive: a killed worker is started again under its label, and a
node that joined later (`late`) is dead, which the executor's inventory leaves out.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from ray_helpers import RayCluster


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayCluster]:
    cluster = RayCluster(tmp_path_factory.mktemp("ray"))
    yield cluster
    import ray

    ray.shutdown()
    cluster.stop()
