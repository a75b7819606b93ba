"""Small usage mistakes say what is wrong: a duplicate --parallel key, a zero --expires,
--policy beside --compare; an unnamed token's revocation prints no empty parentheses."""

from __future__ import annotations

import pytest
from cli_helpers import run_main


def test_a_parallel_key_given_twice_is_a_usage_error(monkeypatch, capsys) -> None:
    args = ("estimate", "-m", "llama3-8b", "-c", "h100:8", "--parallel", "tp=8,tp=4,pp=2")
    assert run_main(monkeypatch, *args) == 2
    assert "'tp' is given twice" in capsys.readouterr().err


def test_a_zero_lifetime_says_it_must_be_positive(monkeypatch, capsys) -> None:
    assert run_main(monkeypatch, "token", "create", "--expires", "0d") == 2
    err = capsys.readouterr().err
    assert "must be more than 0" in err and "give a number" not in err


def test_policy_beside_compare_is_a_usage_error(monkeypatch, capsys, tmp_path) -> None:
    (tmp_path / "q.yaml").write_text("queues:\n  - name: eval\n")
    (tmp_path / "t.jsonl").write_text("")
    args = ("sim", "run", "--cluster", "h100:8", "--queues", str(tmp_path / "q.yaml"),
            "--trace", str(tmp_path / "t.jsonl"), "--policy", "fifo", "--compare")  # fmt: skip
    assert run_main(monkeypatch, *args) == 2
    assert "leave out --policy fifo" in capsys.readouterr().err


def test_revoking_an_unnamed_token_prints_no_empty_parentheses(monkeypatch, capsys) -> None:
    class Answer:
        def __init__(self, *args: object) -> None:
            pass

        def call(self, *args: object, **kwargs: object) -> dict:
            return {"id": "t2130e4959adb", "name": ""}

    monkeypatch.setattr("argosy.cli.tokens.Client", Answer)
    assert run_main(monkeypatch, "token", "revoke", "t2130e4959adb") == 0
    assert capsys.readouterr().out.strip() == "revoked t2130e4959adb"


def test_an_event_log_without_one_event_points_at_its_first_line(
    monkeypatch, capsys, tmp_path
) -> None:
    (tmp_path / "events.jsonl").write_text("\nnot json\n")
    assert run_main(monkeypatch, "runs", "show", str(tmp_path)) == 2
    err = capsys.readouterr().err
    assert "events.jsonl:2: not an event" in err and "'not json'" in err
    (tmp_path / "events.jsonl").write_text("")
    assert run_main(monkeypatch, "runs", "show", str(tmp_path), "--json") == 2
    assert "is empty" in capsys.readouterr().err


class _Ctx:
    def find_root(self) -> _Ctx:
        return self

    obj = None


def test_restart_policy_without_a_spare_says_it_only_warns(capsys) -> None:
    from argosy.cli.launch import _runtime_config

    config = _runtime_config(_Ctx(), None, None, "restart", 0)
    assert config.straggler_policy == "restart"
    assert "only warned about" in capsys.readouterr().err
    _runtime_config(_Ctx(), None, None, "restart", 1)
    assert capsys.readouterr().err == ""


def test_the_two_slow_factors_each_name_the_other_meaning() -> None:
    from argosy.core.errors import ArgosyError
    from argosy.health.throttle import parse_slow
    from argosy.runtime.inject import parse_injection

    with pytest.raises(ArgosyError, match="a slowdown .*--emulate-slow takes the speed"):
        parse_injection("slow:rank=1:factor=0.3:from_step=5", world_size=2)
    with pytest.raises(ArgosyError, match="the speed kept .*--inject slow takes the slowdown"):
        parse_slow(["1:2"])
