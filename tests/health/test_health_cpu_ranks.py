"""A CPU node is checked with at least 2 ranks, as the help and docs/health.md say: one
rank has no peer to compare or collective to run, so `--ranks 1` is refused there."""

from __future__ import annotations

import pytest

from argosy.core.errors import ConfigError
from argosy.hardware.discovery import discover
from argosy.health.config import HealthConfig
from argosy.health.harness import plan_node

cpu_only = pytest.mark.skipif(discover()[0].backend != "cpu", reason="an accelerator node")


@cpu_only
def test_one_rank_on_a_cpu_node_is_refused() -> None:
    with pytest.raises(ConfigError, match="at least 2 ranks"):
        plan_node(HealthConfig(), ranks=1)


@cpu_only
def test_two_ranks_on_a_cpu_node_are_planned() -> None:
    assert plan_node(HealthConfig(), ranks=2).num_ranks == 2
