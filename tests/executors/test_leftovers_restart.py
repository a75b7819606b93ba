"""A starting server counts its own job users idle from its start: what users idle when
the last server stopped left still goes (`LeftoverRemoval.idle_from_now`), and only
theirs."""

from __future__ import annotations

import pwd
from collections.abc import Callable

from argosy.core.clock import FakeClock
from argosy.executors.isolation import JOB_USER_COMMENT, JobIdentity
from argosy.executors.leftovers import LeftoverRemoval
from argosy.executors.limits import JobLimitsConfig


def _passwd(name: str, uid: int) -> pwd.struct_passwd:
    return pwd.struct_passwd((name, "x", uid, uid, JOB_USER_COMMENT, "/", "/bin/sh"))


def test_a_starting_server_counts_its_job_users_idle_from_then() -> None:
    """What the last server knew of idle users died with it: the next one counts its own
    job users (not another base's, not accounts it did not make) idle from its start."""
    clock = FakeClock(1000.0)
    accounts = [
        _passwd("argosy-job-a", 20031),
        _passwd("argosy-job-b", 20032),
        _passwd("argosy-job", 20033),
        _passwd("other-base-a", 20034),  # another server's users
        _passwd("argosy-job-c", 20099),  # not made by the server (its comment differs)
    ]
    identity = JobIdentity("argosy-job")
    removal = LeftoverRemoval(
        grace_s=60,
        clock=clock.now_s,
        is_cleanable=lambda uid: uid != 20099,
        accounts=lambda: accounts,
    )
    removal.idle_from_now(identity.names)
    clock.advance(60)
    assert sorted(removal.due(busy={20032})) == [20031, 20033]  # b's adopted attempt runs
    assert not JobIdentity(None).names("argosy-job-a")


def test_a_local_executor_with_job_users_counts_them_idle_at_its_start() -> None:
    from argosy.executors.local import LocalExecutor, LocalOptions

    class Spy(LeftoverRemoval):
        asked: list[bool] = []

        def idle_from_now(self, mine: Callable[[str], bool]) -> None:
            self.asked.append(mine("argosy-zz-q") and not mine("argosy-yy-q"))

    identity = JobIdentity("argosy-zz")
    LocalExecutor(LocalOptions(identity=identity), leftovers=Spy()).close()
    LocalExecutor(LocalOptions(identity=JobIdentity(None)), leftovers=Spy()).close()
    off = JobLimitsConfig(remove_leftovers=False)
    LocalExecutor(LocalOptions(identity=identity, limits=off), leftovers=Spy()).close()
    assert Spy.asked == [True]  # once: job users, with their removal on
