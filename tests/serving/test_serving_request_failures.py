"""One request's failure stays that request's: a proposer that raises inside a batched step
fails its own row while the co-batched requests decode on, token for token as alone; and
the worker answers a stream whose engine raises anything (OSError, IndexError), so the
caller gets an error rather than waiting for ever, and the worker serves on."""

import multiprocessing
import queue
import threading

import pytest
from tiny_llama import batch_loop, decoder, held_busy_request

from argosy.serving.errors import EngineFailedError
from argosy.serving.types import GenerationChunk, GenerationRequest, SamplingParams
from argosy.serving.worker import _rebuild, _serve_messages


class ExplodingProposer:
    """Raises on its first draft, as a proposer with a bug or a lost file would."""

    def __init__(self) -> None:
        self.calls = 0

    def propose(self, context, max_tokens):
        self.calls += 1
        raise OSError("the draft checkpoint went away")


class ObserverThatRaises:
    """Drafts nothing, then raises when told how its (plain) step went."""

    def __init__(self) -> None:
        self.calls = 0

    def propose(self, context, max_tokens):
        return []

    def observe(self, step):
        self.calls += 1
        raise IndexError("proposer state out of range")


def _solo(model, prompt, max_tokens):
    return [t for new, _ in decoder(model, prompt, max_tokens) for t in new]


def _tokens(slot):
    return [t for new, _ in slot.chunks() for t in new]


@pytest.mark.parametrize("faulty", [ExplodingProposer, ObserverThatRaises])
def test_a_proposer_that_raises_in_a_batched_step_fails_only_its_own_row(tiny_model, faulty):
    loop = batch_loop(tiny_model, max_batch_size=4)
    first, release = held_busy_request(loop, tiny_model, [1, 2, 3], 8)
    bad = decoder(tiny_model, [4, 4, 8, 4, 4], 8)
    bad.proposer = faulty()
    others = [
        decoder(tiny_model, [5, 9, 2, 5, 9], 8, proposer="ngram"),
        decoder(tiny_model, [7, 3, 1], 8),
    ]
    bad_slot = loop.submit(bad)
    slots = [loop.submit(d) for d in others]
    release()  # all three join the busy one at the next admission: a batch of four
    with pytest.raises((OSError, IndexError)):
        _tokens(bad_slot)
    assert bad.proposer.calls == 1
    assert _tokens(slots[0]) == _solo(tiny_model, [5, 9, 2, 5, 9], 8)
    assert _tokens(slots[1]) == _solo(tiny_model, [7, 3, 1], 8)
    assert _tokens(first) == _solo(tiny_model, [1, 2, 3], 8)
    assert loop.batch_steps > 0  # the failure happened in a batched step


class FailingEngine:
    """Its streams raise what `request.speculative` names, before any chunk; `ok` streams."""

    def stream(self, request):
        if request.speculative == "oserror":
            raise OSError("No such file or directory: '/somewhere/config.json'")
        if request.speculative == "indexerror":
            raise IndexError("list index out of range")
        yield GenerationChunk((5,), "a", "stop")


def test_the_worker_answers_a_stream_whose_engine_raises_anything_and_serves_on():
    parent, child = multiprocessing.Pipe()
    serving = threading.Thread(
        target=_serve_messages,
        args=(child, FailingEngine(), child.send, lambda code: None),
        daemon=True,
    )
    serving.start()
    try:
        for rid, spec in enumerate(["oserror", "indexerror"], start=1):
            request = GenerationRequest((1, 2), SamplingParams(max_tokens=1), spec)
            parent.send(("stream", rid, request))
            assert parent.poll(5), f"no answer to a stream whose engine raised ({spec})"
            kind, got, payload = parent.recv()
            assert (kind, got) == ("err", rid)
            error = _rebuild(payload)  # what the waiting caller raises
            assert isinstance(error, EngineFailedError)
            assert "/somewhere" not in str(error)  # the details stay in the worker's log
        parent.send(("stream", 3, GenerationRequest((1, 2), SamplingParams(max_tokens=1), "ok")))
        assert parent.poll(5)
        assert parent.recv()[0] == "chunk"
        assert parent.poll(5)
        assert parent.recv() == ("end", 3, None)
    finally:
        parent.send(("exit", 0, None))
        serving.join(timeout=10)
    assert not serving.is_alive()


def test_a_fault_outside_a_step_fails_its_requests_and_the_loop_serves_on(tiny_model):
    """An error where the loop admits, joins or stages requests (not inside a decode step)
    reaches the requests it concerned; the loop thread lives on and serves the next."""
    loop = batch_loop(tiny_model, max_batch_size=4)
    join, failures = loop._join, []

    def join_once_broken(slots):
        if not failures:
            failures.append(len(slots))
            raise MemoryError("the batched cache did not fit")
        return join(slots)

    loop._join = join_once_broken
    with pytest.raises(MemoryError):
        _within(60, _tokens, loop.submit(decoder(tiny_model, [1, 2, 3], 6)))
    assert failures == [1]
    after = _within(60, _tokens, loop.submit(decoder(tiny_model, [7, 3, 1], 6)))
    assert after == _solo(tiny_model, [7, 3, 1], 6)


def _within(seconds, fn, *args):
    """`fn(*args)` on a daemon thread, waited for at most `seconds` (a dead loop would
    leave it waiting for ever): its result, or what it raised."""
    box = queue.Queue()

    def call():
        try:
            box.put((True, fn(*args)))
        except BaseException as err:  # handed to the caller
            box.put((False, err))

    threading.Thread(target=call, daemon=True).start()
    ok, value = box.get(timeout=seconds)
    if not ok:
        raise value
    return value
