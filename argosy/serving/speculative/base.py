"""The proposer contract: `propose(context, max_tokens) -> draft`; optional abilities
`observe(step)` (learn from each step) and `offer(context, max_tokens)` (hand the batch loop
a draft it may shorten, with an acceptance estimate)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from argosy.plugins.registry import Registry

OFF = "off"
"""The speculation setting that disables proposers."""


@dataclass(frozen=True)
class StepRecord:
    """One engine step as a proposer sees it: what was drafted, kept, and what it cost."""

    num_drafted: int
    num_accepted: int
    elapsed_s: float
    draft_token_cost: float | None = None
    """The engine's measured cost of one draft token, relative to a plain step."""


@runtime_checkable
class Proposer(Protocol):
    """Drafts up to `max_tokens` continuation tokens of `context` (may return none)."""

    def propose(self, context: Sequence[int], max_tokens: int) -> list[int]:
        """Draft tokens; an empty list means "decode one token plainly"."""
        ...


@runtime_checkable
class ObservesSteps(Protocol):
    """Optional ability: learn from every step's acceptance and cost."""

    def observe(self, step: StepRecord) -> None:
        """Record one step's outcome."""
        ...


NEW_ROW_ACCEPTANCE = 0.5
"""The most acceptance a batch row claims for its draft before any of its own drafts were
verified. The engine's running acceptance is a good start for a request alone, but in a
batch it is the other requests' (after copy-heavy traffic 0.95 for every new open-ended
row), and one optimistic row widens the pass for all: width 8 for 14 rows, 3 drafting."""


@dataclass(frozen=True)
class DraftOffer:
    """A draft handed to the batch loop before a batched verify pass."""

    tokens: tuple[int, ...] = ()
    acceptance: float = 0.0
    """The proposer's estimate that each next draft token is accepted."""
    adaptive: bool = False
    """True: the loop may verify only a prefix; False: the whole draft is verified."""


@runtime_checkable
class OffersDrafts(Protocol):
    """Optional ability: offer a draft whose length the batch policy decides."""

    def offer(self, context: Sequence[int], max_tokens: int) -> DraftOffer:
        """The longest draft worth verifying now, with its acceptance estimate."""
        ...


ProposerFactory = Callable[..., Proposer]

PROPOSERS: Registry[ProposerFactory] = Registry("speculative proposer")


@dataclass(frozen=True)
class ProposerContext:
    """What an engine offers a proposer when it builds one for a request."""

    target: Any = None
    """The served model (an HF causal LM for the transformers engine); None if not exposed."""
    arg: str | None = None
    """The text after the colon in the proposer spec (`draft:PATH` -> `PATH`)."""
    acceptance: float | None = None
    """The engine's running acceptance of this proposer's drafts (None: nothing measured)."""
