"""One console line per thing an operator must know: faults, detections, restarts, the end.

Pure: `notice(event)` turns an event of the log (see `agent`) into the line the launcher
prints, or None for events that only the log keeps (steps, checkpoints). The lines are
the agent's side of the story, as torchrun's agent prints them:

    [argosy] fault: rank 1 exited with code 3 (attempt 0); detected at 4.21 s
    [argosy] group of attempt 0 stopped
    [argosy] restart 1 of 3 (exit fault): starting attempt 1
    [argosy] attempt 1 resumed from step 25
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

PREFIX = "[argosy]"


def _fault(e: dict[str, Any]) -> str:
    latency = ""
    if e.get("injected_at_s") is not None:
        latency = f", {e['detected_at_s'] - e['injected_at_s']:.2f} s after it struck"
    action = {
        "restart": "the group stops and restarts",
        "give_up": "no restarts left: the group stops",
        "warn": "warning only, training goes on",
    }.get(e.get("action", ""), e.get("action", ""))
    return (
        f"fault: {e.get('detail') or e['kind']} (attempt {e['attempt']}); detected at "
        f"{e['detected_at_s']:.2f} s{latency}; {action}"
    )


def _stopped(e: dict[str, Any]) -> str:
    how = " (SIGKILL was needed)" if e.get("needed_kill") else ""
    stacks = f"; stacks: {', '.join(e['stacks'])}" if e.get("stacks") else ""
    return f"group of attempt {e['attempt']} stopped{how}{stacks}"


def _restart(e: dict[str, Any], max_restarts: int) -> str:
    attempt, reason = e["attempt"], e.get("reason", "")
    return f"restart {attempt} of {max_restarts} ({reason} fault): starting attempt {attempt}"


def _resume(e: dict[str, Any]) -> str | None:
    if e.get("attempt", 0) == 0:
        return None
    return f"attempt {e['attempt']} resumed from step {e.get('step')}"


def _preflight(e: dict[str, Any]) -> str:
    left = ", ".join(f"device {d['device']} ({d['why']})" for d in e.get("excluded") or [])
    out = f"; left out: {left}" if left else ""
    use = f"; using device(s) {', '.join(map(str, e['use']))}" if e.get("use") else ""
    refused = f"; launch refused: {e['refused']}" if e.get("refused") else ""
    head = f"preflight: node {e.get('verdict')} in {e.get('elapsed_s', 0):.1f} s"
    return head + out + use + refused


def notice(event: dict[str, Any], max_restarts: int) -> str | None:
    """The console line for `event`, or None when it is not worth a line."""
    kind = event.get("event")
    formats: dict[str, Callable[[dict[str, Any]], str | None]] = {
        "fault": _fault,
        "stopped": _stopped,
        "restart": lambda e: _restart(e, max_restarts),
        "resume": _resume,
        "preflight": _preflight,
        "give_up": lambda e: f"giving up after {e.get('restarts')} restart(s)",
        "close_error": lambda e: f"after the run was done: {e.get('detail')}",
        "linger": lambda e: f"ranks {e.get('ranks')} lingered after finishing; stopped",
    }
    line = formats[kind](event) if kind in formats else None
    return f"{PREFIX} {line}" if line else None
