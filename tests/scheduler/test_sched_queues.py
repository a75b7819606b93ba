"""The queue tree: quotas resolved per chip, and pointed errors for impossible trees."""

import pytest

from argosy.core.errors import ConfigError
from argosy.hardware.loader import load_cluster
from argosy.scheduler.queues import load_queues

CLUSTER = load_cluster("h100:64+910b:32")

GOOD = """\
queues:
  - name: org
    children:
      - name: infer
        quota:
          h100: {guarantee: 16, ceiling: 16}
      - name: research
        weight: 2
        quota:
          h100: {nominal: 32}
          910b: {nominal: 16, ceiling: 24}
"""


def write(tmp_path, text):
    path = tmp_path / "queues.yaml"
    path.write_text(text)
    return path


def test_quota_resolution_and_borrowing(tmp_path):
    tree = load_queues(write(tmp_path, GOOD), CLUSTER)
    assert tree.leaves == ["infer", "research"]
    assert tree.nominal[tree.index["org"], tree.chip_index["h100-sxm"]] == 48  # children's sum
    assert tree.reserved_for_others("research", "h100-sxm") == 16  # infer's unused guarantee
    tree.add("research", "h100-sxm", 30)
    assert tree.borrowed_if("research", "h100-sxm", 8) == 6
    assert tree.headroom("research", "910b") == 24  # explicit ceiling binds
    assert tree.headroom("research", "h100-sxm") > 10**9  # no explicit ceiling


@pytest.mark.parametrize(
    ("text", "line", "needle"),
    [
        (GOOD.replace("guarantee: 16, ceiling: 16", "guarantee: 80, ceiling: 80"), 6,
         "guarantees for h100-sxm add up to"),
        (GOOD.replace("h100: {nominal: 32}", "h200: {nominal: 32}"), 11, "not in the cluster"),
        (GOOD.replace("h100: {nominal: 32}", "h1000: {nominal: 32}"), 11, "unknown chip"),
        (GOOD.replace("{nominal: 16, ceiling: 24}", "{nominal: 16, ceiling: 8}"), 12,
         "guarantee <= nominal <= ceiling"),
        (GOOD.replace("    children:\n", "    quota: {h100: {guarantee: 4}}\n    children:\n"),
         3, "leaf queues"),
        (GOOD.replace("weight: 2", "wieght: 2"), 8, "unknown key"),
    ],
    ids=["guarantees-exceed-cluster", "chip-not-in-cluster", "unknown-chip",
         "ceiling-below-nominal", "guarantee-on-inner-queue", "typo"],
)  # fmt: skip
def test_impossible_trees_are_pointed_errors(tmp_path, text, line, needle):
    with pytest.raises(ConfigError) as err:
        load_queues(write(tmp_path, text), CLUSTER)
    assert needle in str(err.value)
    assert err.value.line is not None and abs(err.value.line - line) <= 2, str(err.value)
