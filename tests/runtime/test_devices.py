"""Device choice per rank (argosy.runtime.devices): pure, so any CUDA count can be faked."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from argosy.runtime.devices import FORMS, backend_for, resolve_device

ranks = st.integers(min_value=0, max_value=63)
counts = st.integers(min_value=0, max_value=16)


@given(local_world=st.integers(1, 16), count=counts, data=st.data())
def test_auto_gives_each_local_rank_its_own_gpu_or_falls_back_to_cpu(local_world, count, data):
    local_rank = data.draw(st.integers(0, local_world - 1))
    device = resolve_device("auto", local_rank, count, local_world)
    if count >= local_world:
        assert device == f"cuda:{local_rank}"
    else:
        assert device == "cpu"


@given(local_world=st.integers(1, 16), count=st.integers(1, 16), data=st.data())
def test_cuda_maps_local_ranks_to_distinct_gpus(local_world, count, data):
    if local_world > count:
        with pytest.raises(ValueError, match="NCCL needs one GPU per rank"):
            resolve_device("cuda", 0, count, local_world)
        return
    devices = [resolve_device("cuda", r, count, local_world) for r in range(local_world)]
    assert len(set(devices)) == local_world
    assert all(backend_for(d) == "nccl" for d in devices)


@given(local_rank=ranks, count=st.integers(1, 16))
def test_cuda_wraps_local_rank_modulo_the_count(local_rank, count):
    assert resolve_device("cuda", local_rank, count) == f"cuda:{local_rank % count}"


@given(local_rank=ranks, count=counts, local_world=st.integers(1, 8))
def test_cpu_is_always_cpu_and_gloo(local_rank, count, local_world):
    device = resolve_device("cpu", local_rank, count, local_world)
    assert device == "cpu" and backend_for(device) == "gloo"


@given(index=st.integers(0, 31), count=counts)
def test_an_explicit_index_must_exist(index, count):
    if index < count:
        assert resolve_device(f"cuda:{index}", 0, count) == f"cuda:{index}"
    else:
        with pytest.raises(ValueError, match="cuda") as err:
            resolve_device(f"cuda:{index}", 0, count)
        assert FORMS in str(err.value) or "--device cpu" in str(err.value)


def test_spec_is_case_and_space_insensitive():
    assert resolve_device(" CUDA:1 ", 0, 2) == "cuda:1"
    assert resolve_device("Auto", 0, 1) == "cuda:0"


@pytest.mark.parametrize(
    ("spec", "count", "local_world", "says"),
    [
        ("cuda:7", 1, 1, "this node has 1 CUDA device(s), cuda:0 to cuda:0"),
        ("tpu", 1, 1, f"not one of the accepted forms: {FORMS}"),
        ("cuda:x", 1, 1, f"not one of the accepted forms: {FORMS}"),
        ("cuda:-1", 2, 1, "not one of the accepted forms"),
        ("", 2, 1, "not one of the accepted forms"),
        ("cuda", 0, 1, "no CUDA device is visible; use --device cpu or auto"),
        ("cuda:0", 0, 1, "no CUDA device is visible"),
        ("cuda", 1, 2, "2 ranks on this node but 1 CUDA device(s)"),
        ("cuda:0", 2, 2, "puts all 2 local ranks on one GPU"),
    ],
)
def test_bad_specs_say_what_is_accepted(spec, count, local_world, says):
    with pytest.raises(ValueError) as err:
        resolve_device(spec, 0, count, local_world)
    assert says in str(err.value)


@pytest.mark.parametrize(
    ("local_rank", "count", "local_world"), [(-1, 1, 1), (0, -1, 1), (0, 1, 0)]
)
def test_impossible_ranks_and_counts_are_refused(local_rank, count, local_world):
    with pytest.raises(ValueError, match="expected local_rank >= 0"):
        resolve_device("auto", local_rank, count, local_world)


def test_backend_for_an_unknown_device_is_refused():
    with pytest.raises(ValueError, match="expected cpu or cuda"):
        backend_for("xla:0")
