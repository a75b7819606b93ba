"""A snapshot's metadata pickles its tensor entries as one inner pickle, reused while they
stay the same: every round trip still gives back exactly the meta pickled, whatever
sequence of layouts came before, and metas read back never share a list."""

from __future__ import annotations

import pickle

import torch
from ckpt_helpers import meta_of
from hypothesis import given, settings
from hypothesis import strategies as st

from argosy.checkpoint.layout import SnapshotMeta

DTYPES = [torch.float32, torch.bfloat16, torch.int64]

layouts = st.lists(
    st.tuples(st.sampled_from(DTYPES), st.lists(st.integers(0, 6), max_size=2)),
    min_size=1,
    max_size=5,
)


def _meta(specs: list, step: int, as_list: bool) -> SnapshotMeta:
    tensors = [torch.zeros(shape, dtype=dtype) for dtype, shape in specs]
    state = {"t": tensors if as_list else dict(enumerate(tensors)), "step": step}
    return meta_of(state, step)[0]


def _types(meta: SnapshotMeta) -> dict:
    return {fqn: [type(p).__name__ for p in path] for fqn, path in meta.mappings.items()}


@settings(max_examples=40, deadline=None)
@given(steps=st.lists(st.tuples(layouts, st.booleans(), st.booleans()), min_size=1, max_size=8))
def test_every_round_trip_gives_back_the_meta_pickled(steps):
    """Layouts repeat, change, or keep their entries but nest them another way (a list's
    positions against a dict's int keys: equal paths, other types)."""
    for step, (specs, as_list, twice) in enumerate(steps):
        meta = _meta(specs, step, as_list)
        for _ in range(2 if twice else 1):
            back = pickle.loads(pickle.dumps(meta))
            assert back == meta
            assert _types(back) == _types(meta)


def test_a_changed_entry_is_pickled_afresh():
    meta = _meta([(torch.float32, [4])], 1, False)
    pickle.loads(pickle.dumps(meta))
    moved = SnapshotMeta(**{**meta.__dict__, "tensors": list(meta.tensors)})
    entry = moved.tensors[0]
    moved.tensors[0] = type(entry)(**{**entry.__dict__, "offset": entry.offset + 4096})
    back = pickle.loads(pickle.dumps(moved))
    assert back.tensors[0].offset == entry.offset + 4096


def test_metas_read_back_share_no_list():
    meta = _meta([(torch.float32, [4]), (torch.int64, [2])], 1, False)
    blob = pickle.dumps(meta)
    first, second = pickle.loads(blob), pickle.loads(blob)
    first.tensors.pop()
    assert len(second.tensors) == 2 and pickle.loads(blob).tensors == meta.tensors
