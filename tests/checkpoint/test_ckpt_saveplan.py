"""A save's plan is reused only while the state keeps exactly its tensors (saveplan.py):
whatever changes a leaf's identity, storage, dtype, shape or strides, or the keys, plans
afresh, and a reused plan always equals a fresh one."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from argosy.checkpoint.layout import flatten
from argosy.checkpoint.saveplan import SavePlanner

INLINE = 256


def _state() -> dict:
    return {
        "model": {f"w{i}": torch.rand(100 + 50 * i) for i in range(6)},
        "small": torch.rand(4),  # travels inline
        "loop": {"step": 3, "lr": 0.1},
    }


def _fresh(state: dict):
    return SavePlanner(INLINE).plan(flatten(state)[0])


def _same(a, b) -> bool:
    return (
        a.entries == b.entries
        and a.object_keys == b.object_keys
        and a.data_len == b.data_len
        and a.signature == b.signature
        and all(x is y for x, y in zip(a.tensors, b.tensors, strict=True))
    )


CHANGES: dict[str, Callable[[dict], None]] = {
    "data swapped": lambda s: setattr(s["model"]["w1"], "data", torch.rand(150)),
    "resized": lambda s: s["model"]["w2"].resize_(7),
    "dtype": lambda s: setattr(s["model"]["w0"], "data", torch.rand(100).double()),
    "strides": lambda s: setattr(s["model"]["w3"], "data", torch.rand(2, 125).t().reshape(-1)),
    "new tensor": lambda s: s["model"].__setitem__("w4", torch.rand(300)),
    "key added": lambda s: s["model"].__setitem__("extra", torch.rand(10)),
    "key removed": lambda s: s["model"].pop("w5", None),
    "order": lambda s: s.update(model=dict(reversed(list(s["model"].items())))),
    "object became tensor": lambda s: s["loop"].__setitem__("lr", torch.tensor(0.1)),
    "tensor became object": lambda s: s.__setitem__("small", 1.0),
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_any_change_of_a_leaf_plans_afresh(change: str) -> None:
    state = _state()
    planner = SavePlanner(INLINE)
    first = planner.plan(flatten(state)[0])
    assert planner.plan(flatten(state)[0]) is first and planner.replans == 1
    CHANGES[change](state)
    again = planner.plan(flatten(state)[0])
    assert planner.replans == 2 and again is not first
    assert _same(again, _fresh(state))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from([*CHANGES, "values", "objects"]), min_size=1, max_size=8))
def test_a_reused_plan_always_equals_a_fresh_one(changes: list[str]) -> None:
    state = _state()
    planner = SavePlanner(INLINE)
    planner.plan(flatten(state)[0])
    for change in changes:
        if change == "values":
            state["model"]["w0"].add_(1.0)  # in place: the same plan
        elif change == "objects":
            state["loop"]["step"] += 1
        else:
            CHANGES[change](state)
        planned = planner.plan(flatten(state)[0])
        assert _same(planned, _fresh(state))
        fqns, small = [e.fqn for e in planned.entries], flatten(state)[0].get("small")
        if isinstance(small, torch.Tensor):  # its bytes as they are now
            assert planned.inline_bytes()[fqns.index("small")] == small.numpy().tobytes()


def test_values_changed_in_place_keep_the_plan_and_inline_bytes_follow_them() -> None:
    state = _state()
    planner = SavePlanner(INLINE)
    first = planner.plan(flatten(state)[0])
    state["model"]["w0"].mul_(2.0)
    state["small"].fill_(7.0)
    state["loop"]["step"] = 4
    again = planner.plan(flatten(state)[0])
    assert again is first and planner.replans == 1
    index = [e.fqn for e in again.entries].index("small")
    assert again.inline_bytes()[index] == torch.full((4,), 7.0).numpy().tobytes()
