"""How a gang's attempt on Ray ended: the verdict over its node ranks' answers.

The Ray executor asks each node rank's `NodeRunner` actor for its launcher's exit code
(`poll`) and keeps the answers in a `GangAttempt`. `GangVerdicts`, a base of the
executor, turns them into an `AttemptExit`: the first rank that failed or died ends the
whole gang (node launchers never restart their ranks alone), all ranks exiting 0 is
success. When a gang fails on one node rank, the node to blame is found first: one Ray
has declared dead, or one whose actor does not answer within `PEER_ANSWER_S` or answers
that it is unreachable (lost or hung, before Ray's health check sees it: Ray answers
`ActorUnavailableError` for an actor on such a node). That node leaves placement for
`suspect_s`, so the next attempt is not placed back onto it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from argosy.executors.base import AttemptExit, describe_exit, is_lost

PEER_ANSWER_S = 2.0
"""When a gang fails on one node rank, how long each other rank's actor has to answer:
one that does not is on a node that is lost or hung, which Ray declares dead only after
its health check (seconds to a minute): that node, not the survivor's, is to blame and
stays out of the next placement."""
DIED = -1
FAILED_TO_START = -2
"""Codes of a rank whose actor died, or whose `start` raised (never a real exit code)."""
USAGE_EXIT = 2
"""A launcher's usage error (or a store its nodes do not share): never retried."""

log = logging.getLogger(__name__)


@dataclass
class GangAttempt:
    """One attempt's actors and what each node rank answered so far."""

    job_id: str
    attempt: int
    pg: Any
    actors: list[Any]
    node_ids: list[str] = field(default_factory=list)
    """Ray node id of each node rank (empty when unknown)."""
    names: list[str] = field(default_factory=list)
    """argosy's name of each node rank's node, for reasons (empty when unknown)."""
    codes: dict[int, int] = field(default_factory=dict)
    asks: dict[int, Any] = field(default_factory=dict)
    """Node rank -> its outstanding `poll` call."""
    answered_s: dict[int, float] = field(default_factory=dict)
    """Node rank -> when its actor last answered (a rank in here has started)."""
    stop_s: float | None = None
    """When a stop was asked (monotonic), or None."""
    placed_by_s: float | None = None
    """When Ray must have placed its placement group (monotonic), or None: no deadline
    (an adopted attempt, placed long ago)."""

    @property
    def tag(self) -> str:
        return attempt_tag(self.job_id, self.attempt)


class GangVerdicts:
    """The executor's verdict over its attempts' answers (a base of `RayExecutor`, whose
    Ray thread alone calls these): what it needs of the executor is declared here."""

    ray: Any
    options: Any  # RayOptions: stop_grace_s, suspect_s
    _clock: Callable[[], float]
    _alive: set[str]
    _suspect: dict[str, float]

    def _refresh_nodes(self) -> None:
        raise NotImplementedError

    def _answer(self, a: GangAttempt, i: int, ref: Any) -> bool:
        """Take node rank `i`'s answer to `ref`; False if its actor was unreachable (a
        passing disconnect, or a node Ray has not yet declared dead): ask again."""
        errors = self.ray.exceptions
        del a.asks[i]
        try:
            code = self.ray.get(ref, timeout=0)
        except errors.ActorUnavailableError:
            return False
        except errors.RayActorError:
            a.codes[i] = DIED
            return True
        except errors.RayError as err:
            log.warning("node rank %d of %s: %s", i, a.tag, err)
            a.codes[i] = FAILED_TO_START
            return True
        a.answered_s[i] = self._clock()
        if code is not None:
            a.codes[i] = code
        return True

    def _verdict(self, a: GangAttempt) -> AttemptExit | None:
        """How the attempt ended, or None while it runs: the first rank that failed or
        died ends the whole gang; all ranks exiting 0 is success. A gang's node launchers
        never restart their ranks alone (`--max-restarts 0`), so a node rank that fails
        (other than a usage error, exit 2) ends the attempt as lost: the server starts the
        whole gang again from its checkpoint, within the job's `max_restarts`."""
        job, n = a.job_id, a.attempt
        for i, code in sorted(a.codes.items()):
            if code == DIED:
                self._suspect_node(a, i)
                why = f"node rank {i}'s Ray node{_named(a, i)} died" + _gang_restarts(a)
                return AttemptExit(job, n, None, True, why, (i,))
            if code == FAILED_TO_START:
                return AttemptExit(job, n, None, False, f"node rank {i} could not start")
        gone = self._gone_ranks(a)
        if gone:
            why = _declared_dead(a, gone[0]) + _gang_restarts(a)
            return AttemptExit(job, n, None, True, why, tuple(gone))
        if a.codes:
            worst = max(a.codes.values(), key=lambda c: (c != 0, c))
            if worst != 0 or len(a.codes) == len(a.actors):
                gang_fault = len(a.actors) > 1 and worst not in (0, USAGE_EXIT)
                if gang_fault and a.stop_s is None:
                    dead = self._dead_node_of(a) or self._silent_node_of(a)  # a peer's
                    if dead is not None:  # crash often follows a lost or hung node
                        return AttemptExit(job, n, None, True, *dead)
                    rank = next(i for i, c in sorted(a.codes.items()) if c == worst)
                    why = f"node rank {rank}: {describe_exit(worst)}; the whole gang restarts"
                    return AttemptExit(job, n, worst, True, why)
                return AttemptExit(job, n, worst, is_lost(worst), describe_exit(worst))
        if a.stop_s is not None and self._clock() - a.stop_s > self.options.stop_grace_s:
            why = f"did not stop within {self.options.stop_grace_s:g} s; killed"
            return AttemptExit(job, n, None, True, why)
        return self._unplaced(a)

    def _unplaced(self, a: GangAttempt) -> AttemptExit | None:
        """An attempt Ray has not placed by its deadline ends as lost: the scheduler saw
        its devices free and Ray does not (something Ray counts holds them), so waiting
        on would hang the job unseen; it is queued again, and says why."""
        if a.placed_by_s is None or a.answered_s or self._clock() < a.placed_by_s:
            return None
        if self.ray.util.placement_group_table(a.pg).get("state") == "CREATED":
            a.placed_by_s = None  # placed: its ranks are starting
            return None
        limit = self.options.place_timeout_s
        why = f"Ray did not place its placement group within {limit:g} s"
        why += " (its devices are held by something Ray counts); queued again"
        return AttemptExit(a.job_id, a.attempt, None, True, why)

    def _dead_node_of(self, a: GangAttempt) -> Lost | None:
        """Why the gang ended if one of its nodes is gone by Ray's node table, read now
        (the other nodes' ranks fail on the lost peer before its actor is seen dead), and
        the node ranks gone."""
        self._refresh_nodes()
        gone = self._gone_ranks(a)
        for i in gone:
            self._suspect_node(a, i)
        if not gone:
            return None
        return f"{_declared_dead(a, gone[0])}; the whole gang restarts", tuple(gone)

    def _gone_ranks(self, a: GangAttempt) -> list[int]:
        """Node ranks whose Ray node is dead by the node table as last read, less those
        whose launcher had exited 0 (their part of the gang was done; losing the node
        after that costs the gang nothing)."""
        return [
            i
            for i, node_id in enumerate(a.node_ids)
            if node_id not in self._alive and a.codes.get(i) != 0
        ]

    def _silent_node_of(self, a: GangAttempt) -> Lost | None:
        """Why the gang ended if a node rank still running does not answer within
        `PEER_ANSWER_S` (its node is lost or hung, not yet dead by Ray's table), its actor
        is unreachable (what Ray answers for a node it has not yet declared dead), or its
        actor died meanwhile: that node is suspect. With the silent node ranks."""
        asked = {}
        for i, actor in enumerate(a.actors):
            if i not in a.codes:
                if i not in a.asks:
                    a.asks[i] = actor.poll.remote()
                asked[a.asks[i]] = i
        if not asked:
            return None
        ready, _ = self.ray.wait(list(asked), num_returns=len(asked), timeout=PEER_ANSWER_S)
        unreachable = {asked[ref] for ref in ready if not self._answer(a, asked[ref], ref)}
        silent = sorted({i for ref, i in asked.items() if ref not in ready} | unreachable | {
            i for i, code in a.codes.items() if code == DIED
        })  # fmt: skip
        for i in silent:
            self._suspect_node(a, i)
        if not silent:
            return None
        first = silent[0]
        how = (
            "died"
            if a.codes.get(first) == DIED
            else "is unreachable (Ray: actor unavailable)"
            if first in unreachable
            else f"did not answer within {PEER_ANSWER_S:g} s"
        )
        why = f"node rank {first}'s Ray node{_named(a, first)} {how}; the whole gang restarts"
        return why, tuple(silent)

    def _suspect_node(self, a: GangAttempt, i: int) -> None:
        if i < len(a.node_ids):
            self._suspect[a.node_ids[i]] = self._clock() + self.options.suspect_s
            self._refresh_nodes()


def _node_name(a: GangAttempt, i: int) -> str:
    """argosy's name of node rank `i`'s node, or "" when unknown."""
    return a.names[i] if i < len(a.names) else ""


def _named(a: GangAttempt, i: int) -> str:
    """` (<node name>)` of node rank `i`, or nothing when the name is unknown."""
    return f" ({name})" if (name := _node_name(a, i)) else ""


def _declared_dead(a: GangAttempt, i: int) -> str:
    name, ray_id = _node_name(a, i), a.node_ids[i][:8]
    which = f"{name}, Ray node {ray_id}" if name else ray_id
    return f"node rank {i}'s Ray node ({which}) is dead"


def _gang_restarts(a: GangAttempt) -> str:
    return "; the whole gang restarts" if len(a.actors) > 1 else ""


Lost = tuple[str, tuple[int, ...]]
"""Why a gang ended on a lost node, and the node ranks lost."""


def attempt_tag(job_id: str, attempt: int) -> str:
    """The name of an attempt's placement group, and its actors' with `-<node rank>`."""
    return f"argosy-{job_id}-{attempt}"
