"""Speculative-decoding proposers, registered by name.

A proposer drafts tokens from the context; the engine verifies every draft in one forward
pass and keeps only what the target model itself would have produced, so speculation never
changes greedy output. Proposers are built per request (they may keep per-request state).

    proposer = PROPOSERS.get("ngram")(max_draft_tokens=8)
    draft = proposer.propose(context_ids, 8)
"""

from pathlib import Path

from argosy.core.errors import ConfigError
from argosy.serving.speculative.base import (
    OFF,
    PROPOSERS,
    ObservesSteps,
    Proposer,
    ProposerContext,
    StepRecord,
)

PROPOSERS.register(
    "ngram", "argosy.serving.speculative.ngram:NgramProposer", aliases=("prompt-lookup",)
)
PROPOSERS.register(
    "auto", "argosy.serving.speculative.adaptive:AdaptiveProposer", aliases=("adaptive",)
)
PROPOSERS.register(
    "self", "argosy.serving.speculative.draft:SelfDraftProposer", aliases=("early-exit",)
)
PROPOSERS.register("draft", "argosy.serving.speculative.draft:DraftModelProposer")


def split_spec(spec: str) -> tuple[str, str | None]:
    """`"draft:PATH"` -> `("draft", "PATH")`; `"ngram"` -> `("ngram", None)`."""
    name, sep, arg = spec.partition(":")
    return name.strip().lower(), (arg if sep else None)


def check_name(spec: str) -> None:
    """Raise `UnknownNameError` (listing known names) unless `spec` is `off` or registered."""
    name, _ = split_spec(spec)
    if name != OFF:
        PROPOSERS.canonical(name)


def check_spec(spec: str) -> None:
    """`check_name`, and the argument a server setting needs, checked before anything
    loads (without torch): `draft:PATH` names a checkpoint directory (with config.json),
    `self:K` a whole number of layers. Raises `ConfigError` (exit 2 from the CLI)."""
    name, arg = split_spec(spec)
    if name == OFF:
        return
    canonical = PROPOSERS.canonical(name)
    if canonical == "draft":
        if not arg:
            raise ConfigError("speculative 'draft' needs a checkpoint: draft:PATH")
        where = Path(arg).expanduser()
        if not (where / "config.json").is_file():
            raise ConfigError(f"draft checkpoint not found: {where} has no config.json")
    elif canonical == "self" and arg and not arg.isdigit():
        raise ConfigError(f"speculative 'self:{arg}': the depth is a whole number of layers")


__all__ = [
    "OFF",
    "PROPOSERS",
    "ObservesSteps",
    "Proposer",
    "ProposerContext",
    "StepRecord",
    "check_name",
    "check_spec",
    "split_spec",
]
