"""Fault-injection specs: the forms the issue names parse; malformed ones say the form."""

import pytest
from runtime_helpers import EXAMPLE, argosy

from argosy.core.errors import ArgosyError
from argosy.runtime.inject import Injection, decode, encode, parse_injection

GOOD = [
    ("kill:rank=1:step=30", Injection("kill", 1, step=30)),
    ("hang:rank=0:step=50", Injection("hang", 0, step=50)),
    ("slow:rank=1:factor=2:from_step=10", Injection("slow", 1, step=10, factor=2.0)),
    ("exit:rank=0:step=40:code=1", Injection("exit", 0, step=40, code=1)),
    ("exit:rank=0:at_s=120:code=3", Injection("exit", 0, at_s=120.0, code=3)),
]


@pytest.mark.parametrize(("spec", "expected"), GOOD, ids=[g[0] for g in GOOD])
def test_forms_of_the_issue_parse(spec: str, expected: Injection) -> None:
    assert parse_injection(spec, world_size=2) == expected


BAD = [
    ("boom:rank=1:step=3", "unknown injection kind 'boom'"),
    ("kill:rank=1", "needs a step or at_s trigger"),
    ("kill:step=3", "missing rank"),
    ("kill:rank=x:step=3", "rank must be an integer"),
    ("kill:rank=5:step=3", "out of range"),
    ("slow:rank=1:factor=0.5:from_step=2", "factor must be > 1"),
    ("hang:rank=0:step=3:color=red", "unexpected 'color=red'"),
    ("kill:rank=0:step=0", "steps count from 1"),
]


@pytest.mark.parametrize(("spec", "message"), BAD, ids=[b[0] for b in BAD])
def test_malformed_specs_name_the_problem_and_the_form(spec: str, message: str) -> None:
    with pytest.raises(ArgosyError) as err:
        parse_injection(spec, world_size=2)
    assert message in str(err.value)
    assert "expected" in str(err.value) or "forms:" in str(err.value)


def test_injections_travel_through_the_environment_intact() -> None:
    table = {i: parse_injection(spec) for i, (spec, _) in enumerate(GOOD)}
    assert decode(encode(table)) == table


def test_due_respects_step_and_time_triggers() -> None:
    by_step, by_time = Injection("kill", 0, step=5), Injection("kill", 0, at_s=10.0)
    assert [by_step.due(s, 0.0) for s in (4, 5, 6)] == [False, True, True]
    assert [by_time.due(1, t) for t in (9.9, 10.0)] == [False, True]


CLI_BAD = [
    (["--inject", "kill:rank=9:step=3"], "out of range"),
    (["--inject", "nope"], "unknown injection kind"),
    (["--nproc-per-node", "0"], "nproc-per-node"),
    (["--straggler-policy", "pray"], "expected warn or restart"),
]


@pytest.mark.parametrize(("extra", "message"), CLI_BAD, ids=["rank", "kind", "nproc", "policy"])
def test_cli_rejects_bad_flags_with_exit_2(extra: list[str], message: str) -> None:
    args = ["launch", "--quiet", "--nproc-per-node", "2", *extra, str(EXAMPLE)]
    if extra[0] == "--nproc-per-node":
        args = ["launch", "--quiet", *extra, str(EXAMPLE)]
    done = argosy(*args, timeout=60)
    assert done.returncode == 2
    assert message in done.stderr
    assert "Traceback" not in done.stderr
