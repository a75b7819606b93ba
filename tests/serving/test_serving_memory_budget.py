"""Memory fractions: the budget arithmetic, the device ledger, KV admission (a request that
does not fit waits) and two live services sharing one device while a third is refused."""

import json
import os
import subprocess
import sys
import threading
import time

import httpx
import pytest
from cli_helpers import argosy
from http_helpers import served
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny_llama import batch_loop, decoder

from argosy.core.errors import ArgosyError
from argosy.serving.budget import (
    DeviceLedger,
    DeviceShares,
    MemoryBudget,
    ShareError,
    check_fraction,
    kv_tokens_needed,
)

VOCAB = 48
MIB = 2**20

# -- pure arithmetic -----------------------------------------------------------------------
fractions = st.floats(min_value=0.01, max_value=1.0, allow_nan=False)
operations = st.lists(
    st.tuples(st.sampled_from(["add", "remove"]), st.integers(0, 7), fractions), max_size=40
)


@settings(max_examples=100, deadline=None)
@given(ops=operations)
def test_device_sum_never_exceeds_one_over_random_adds_and_removes(ops):
    shares = DeviceShares("dev0")
    for op, key, fraction in ops:
        before = dict(shares.claims)
        if op == "remove":
            shares.remove(str(key))
            assert str(key) not in shares.claims
        elif str(key) in before:
            with pytest.raises(ShareError):
                shares.add(str(key), fraction)
            assert shares.claims == before
        elif sum(before.values()) + fraction <= 1.0 + 1e-9:
            shares.add(str(key), fraction)  # fits: never refused
            assert shares.claims[str(key)] == fraction
        else:
            with pytest.raises(ShareError) as err:
                shares.add(str(key), fraction)
            assert err.value.field == "memory_fraction"
            assert err.value.current_sum == pytest.approx(sum(before.values()))
            assert f"{sum(before.values()):g}" in str(err.value)
            assert shares.claims == before  # a refusal changes nothing
        assert shares.total <= 1.0 + 1e-9


@given(
    low=fractions,
    high=fractions,
    device=st.integers(1, 2**40),
    weights=st.integers(0, 2**36),
    per_token=st.integers(1, 2**20),
)
def test_kv_capacity_is_monotone_in_the_fraction(low, high, device, weights, per_token):
    low, high = min(low, high), max(low, high)
    small = MemoryBudget(low, device, weights, per_token)
    big = MemoryBudget(high, device, weights, per_token)
    assert small.kv_capacity_tokens <= big.kv_capacity_tokens
    assert big.kv_budget_bytes <= big.budget_bytes - weights or big.kv_budget_bytes == 0
    assert big.kv_capacity_tokens * per_token <= big.kv_budget_bytes


@pytest.mark.parametrize("bad", [0, -0.1, 1.0001, float("nan"), "abc", None, "0.5x"])
def test_bad_fractions_are_refused_naming_the_field(bad):
    with pytest.raises(ShareError, match="memory_fraction"):
        check_fraction(bad)
    assert check_fraction("0.25") == 0.25


def test_weights_that_do_not_fit_are_refused_with_the_least_fraction():
    budget = MemoryBudget(0.1, 4 * 2**30, 540 * MIB, 46080)
    with pytest.raises(ShareError, match=r"memory_fraction 0.1 .* weights alone") as err:
        budget.check()
    least = MemoryBudget(budget.min_fraction() + 1e-6, 4 * 2**30, 540 * MIB, 46080)
    least.check()  # the fraction the message names is enough
    assert f"{budget.min_fraction():.3f}" in str(err.value)


def test_padded_batch_needs_rows_times_the_longest():
    assert kv_tokens_needed([]) == 0
    assert kv_tokens_needed([40]) == 40
    assert kv_tokens_needed([40, 10]) == 2 * (40 + 16)
    assert kv_tokens_needed([200, 10, 10]) == 3 * (200 + 50)


def test_ledger_is_shared_and_drops_dead_processes(tmp_path):
    ledger = DeviceLedger("cpu", tmp_path)
    first = ledger.claim(0.4, "a")
    DeviceLedger("cpu", tmp_path).claim(0.4, "b")  # another reader of the same file
    with pytest.raises(ShareError, match=r"current sum is 0.8"):
        ledger.claim(0.3, "c")
    ledger.release(first)
    ledger.claim(0.3, "c")
    assert ledger.total() == pytest.approx(0.7)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    records = json.loads(ledger.path.read_text())
    records["gone"] = {"fraction": 0.3, "pid": int(dead.stdout), "name": "exited"}
    ledger.path.write_text(json.dumps(records))
    assert ledger.total() == pytest.approx(0.7)  # the exited process's claim is gone


def test_ledger_never_writes_through_a_planted_link(tmp_path):
    """A shared /tmp lets another user plant links where the ledger writes: a claim must
    neither follow them nor clobber their targets."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    ledger_dir = tmp_path / "ledger"
    ledger = DeviceLedger("cpu", ledger_dir)
    ledger_dir.mkdir(mode=0o700)
    ledger.path.symlink_to(victim)  # the ledger file itself
    ledger.path.with_suffix(".tmp").symlink_to(victim)  # the old fixed temporary name
    ledger.claim(0.5, "a")
    assert victim.read_text() == "precious"
    assert not ledger.path.is_symlink() and ledger.total() == pytest.approx(0.5)
    ledger.path.with_suffix(".lock").unlink()
    ledger.path.with_suffix(".lock").symlink_to(victim)
    with pytest.raises(ArgosyError, match="a link"):
        ledger.claim(0.1, "b")
    assert victim.read_text() == "precious"


def test_ledger_directory_must_be_this_users_and_closed(tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    DeviceLedger("cpu", shared).claim(0.2, "a")
    assert shared.stat().st_mode & 0o777 == 0o700  # closed to others from then on
    monkeypatch.setattr(os, "geteuid", lambda: os.getuid() + 1)  # as another user
    with pytest.raises(ArgosyError, match="ARGOSY_DEVICE_LEDGER_DIR"):
        DeviceLedger("cpu", shared).claim(0.2, "b")
    link = tmp_path / "link"
    link.symlink_to(shared)
    monkeypatch.undo()
    with pytest.raises(ArgosyError, match="not a directory"):
        DeviceLedger("cpu", link).claim(0.2, "c")


# -- admission against the KV capacity ---------------------------------------------------
def test_a_request_beyond_the_kv_budget_waits_then_runs(tiny_model):
    prompt_a, prompt_b = [3, 4, 5, 6, 7, 8], [9, 10, 11]
    solo = [[t for new, _ in decoder(tiny_model, p, 24) for t in new] for p in (prompt_a, prompt_b)]
    one = len(prompt_a) + 24 + 2  # each alone fits, both together do not
    loop = batch_loop(tiny_model, 8, kv_capacity_tokens=one + 4, max_draft_tokens=2)
    first = loop.submit(decoder(tiny_model, prompt_a, 24)).chunks()
    out_a = list(next(first)[0])
    second = loop.submit(decoder(tiny_model, prompt_b, 24)).chunks()
    deadline = time.monotonic() + 5
    while loop.queued == 0 and time.monotonic() < deadline:
        time.sleep(0.001)
    waited = loop.queued == 1 and loop.running == 1
    out_a += [t for new, _ in first for t in new]
    out_b = [t for new, _ in second for t in new]
    assert waited  # the second waited at the head of the queue instead of failing
    assert (out_a, out_b) == (solo[0], solo[1])
    assert loop.kv_reserved_tokens == 0 and loop.queued == 0


def test_a_request_that_never_fits_fails_instead_of_waiting_for_ever(tiny_model):
    loop = batch_loop(tiny_model, 8, kv_capacity_tokens=20, max_draft_tokens=0)
    with pytest.raises(ValueError, match="KV budget holds 20"):
        list(loop.submit(decoder(tiny_model, [1, 2, 3], 30)).chunks())
    assert [len(new) for new, _ in loop.submit(decoder(tiny_model, [1, 2, 3], 4)).chunks()]


# -- live: two services on one device, a third refused -----------------------------------
DEVICE_BYTES = 3 * 2**30
"""The shared "device": 0.4 of it holds the 135M model's 0.54 GB of fp32 weights and a KV
budget of about 15k tokens."""


def _service(fraction):
    from argosy.serving import ENGINES, EngineConfig
    from argosy.serving.api import build_app

    config = EngineConfig(
        speculative="off",
        num_threads=1,
        memory_fraction=fraction,
        device_memory_bytes=DEVICE_BYTES,
        max_context_tokens=512,
    )
    engine = ENGINES.get("transformers")(config)
    engine.load()
    return engine, build_app(engine, served_name="smollm2-135m", admin_token="t")


@pytest.mark.slow
def test_two_services_share_a_device_and_a_third_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("ARGOSY_DEVICE_LEDGER_DIR", str(tmp_path))
    ledger = DeviceLedger("cpu")
    claims = [ledger.claim(0.4, "a"), ledger.claim(0.4, "b")]
    services = [_service(0.4), _service(0.4)]
    body = {
        "model": "smollm2-135m",
        "prompt": "The capital of France is",
        "max_tokens": 4,
        "temperature": 0,
    }
    answers = [None, None]
    with served(services[0][1]) as url_a, served(services[1][1]) as url_b:

        def ask(i, url):
            answers[i] = httpx.post(f"{url}/v1/completions", json=body, timeout=120).json()

        threads = [threading.Thread(target=ask, args=(i, u)) for i, u in enumerate((url_a, url_b))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        state = httpx.get(f"{url_a}/admin/state", headers={"authorization": "Bearer t"}).json()
        metrics = httpx.get(f"{url_b}/metrics").text
    assert all(a["choices"][0]["text"] for a in answers)
    assert answers[0]["choices"][0]["text"] == answers[1]["choices"][0]["text"]
    budget = state["memory_budget"]
    assert budget["memory_fraction"] == 0.4 and budget["budget_bytes"] == int(0.4 * DEVICE_BYTES)
    assert (
        0 < budget["kv_capacity_tokens"] * budget["kv_bytes_per_token"] <= budget["kv_budget_bytes"]
    )
    assert "argosy_serving_memory_fraction 0.4" in metrics
    assert "argosy_serving_kv_capacity_tokens" in metrics

    refused = argosy("serve", "--memory-fraction", "0.3", "--port", "0", timeout=60)
    assert refused.returncode == 2, refused.stderr
    assert "memory_fraction 0.3" in refused.stderr and "current sum is 0.8" in refused.stderr
    assert ledger.total() == pytest.approx(0.8)  # the refused service claimed nothing
    for claim in claims:
        ledger.release(claim)
    assert os.listdir(tmp_path)


def test_weights_beyond_the_fraction_refuse_to_load():
    from argosy.core.errors import ArgosyError
    from argosy.serving import ENGINES, EngineConfig

    config = EngineConfig(memory_fraction=0.05, device_memory_bytes=2**30, num_threads=1)
    engine = ENGINES.get("transformers")(config)
    with pytest.raises(ArgosyError, match="weights alone"):
        engine.load()
    assert engine._model is None  # refused before reading the weights


@pytest.mark.parametrize("bad", ["0", "-1", "1.5", "abc", "nan"])
def test_cli_refuses_bad_fractions_with_exit_2(bad):
    from typer.testing import CliRunner

    from argosy.cli.app import app

    result = CliRunner().invoke(app, ["serve", "--memory-fraction", bad])
    assert result.exit_code == 2
    assert "--memory-fraction" in result.output
