"""Executors: turn a placed workload into processes (resource layer).

An executor knows the nodes it can run on (`inventory`), starts one attempt of a job
on the nodes the scheduler chose (`start`), stops it (`stop`), reports attempts that
ended (`poll`) and, after the server restarts, tells whether an attempt it started
earlier is still running (`adopt`). It makes no decisions: which job runs where is the
scheduler's, what an exit means for the job is the server's.

    executor = executors.get("local")(LocalOptions(home=Path("~/.argosy")))
    executor.start(LaunchRequest(...)); exits = executor.poll()
"""

from __future__ import annotations

from argosy.executors.base import AttemptExit, Executor, LaunchRequest, NodeInfo
from argosy.plugins.registry import Registry

executors: Registry[type] = Registry("executor")
executors.register("local", "argosy.executors.local:LocalExecutor")
executors.register("ray", "argosy.executors.ray:RayExecutor")

__all__ = ["AttemptExit", "Executor", "LaunchRequest", "NodeInfo", "executors"]
