"""Which of a machine's devices each attempt holds: the local executor's device indices.

The scheduler counts devices per node; processes sharing one machine must also know
*which* devices are theirs, or two 4-GPU jobs on an 8-GPU host both run on GPUs 0-3.
`DeviceBook` gives each attempt the indices it runs on and takes them back at its end;
the executor puts them in the vendor's variable (`argosy.core.visibility`), so an
attempt's ranks (LOCAL_RANK -> cuda:LOCAL_RANK) land on its own devices.

    book = DeviceBook({"gpu-host": [0, 1, 2, 3, 4, 5, 6, 7]})
    book.take("j1", {"gpu-host": 4})      # {"gpu-host": (0, 1, 2, 3)}
    book.take("j2", {"gpu-host": 4})      # {"gpu-host": (4, 5, 6, 7)}
    book.take("j3", {"gpu-host": 1})      # DevicesBusyError: every device is held

A tidal replica put to sleep lends its device (`lend`): another attempt may take it,
lent devices last, and the replica gets it back on waking (`take_back`) only if nobody
holds it then. Nodes the book does not know (CPU slots) have no indices: taking there
gives nothing and always succeeds.

The contract, which the property tests check after every step: no device is held by two
attempts that are not lent; an attempt holds exactly the count per node it asked for;
what `take` refuses leaves the book unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from argosy.core.errors import ArgosyError

Held = dict[str, tuple[int, ...]]
"""Node -> device indices (as the server process numbers them)."""


class DevicesBusyError(ArgosyError):
    """An attempt asked for more devices of a node than are free there."""


@dataclass
class _Holding:
    held: Held
    lent: bool = False


class DeviceBook:
    """Device indices per node, and who holds which."""

    def __init__(self, devices: Mapping[str, list[int]]) -> None:
        self.devices = {node: sorted(indices) for node, indices in devices.items()}
        self._holders: dict[str, _Holding] = {}

    def held(self, holder: str) -> Held:
        """What `holder` holds ({} if nothing)."""
        found = self._holders.get(holder)
        return dict(found.held) if found is not None else {}

    def free(self, node: str) -> list[int]:
        """The node's devices nobody holds, then those only lent ones hold."""
        taken, lent = self._in_use(node)
        known = self.devices.get(node, [])
        return [i for i in known if i not in taken | lent] + [i for i in known if i in lent - taken]

    def take(self, holder: str, wanted: Mapping[str, int]) -> Held:
        """Give `holder` `wanted[node]` devices of each known node (replacing what it held).
        Raises DevicesBusyError, changing nothing, when a node has fewer free."""
        before = self._holders.pop(holder, None)
        held: Held = {}
        for node, count in wanted.items():
            if node not in self.devices:
                continue
            free = self.free(node)
            if count > len(free):
                if before is not None:
                    self._holders[holder] = before
                raise DevicesBusyError(_busy(node, count, free, self._holders_on(node)))
            held[node] = tuple(sorted(free[:count]))
        self._holders[holder] = _Holding(held)
        return dict(held)

    def restore(self, holder: str, held: Mapping[str, list[int]], *, lent: bool = False) -> None:
        """Record what an attempt adopted after a restart holds (its own record says);
        indices the book does not know are dropped."""
        kept = {n: tuple(i for i in v if i in self.devices.get(n, [])) for n, v in held.items()}
        self._holders[holder] = _Holding({n: v for n, v in kept.items() if v}, lent)

    def release(self, holder: str) -> None:
        """The attempt ended: its devices are free."""
        self._holders.pop(holder, None)

    def lend(self, holder: str) -> None:
        """The holder (an asleep replica) lets others take its devices meanwhile."""
        if holder in self._holders:
            self._holders[holder].lent = True

    def take_back(self, holder: str) -> bool:
        """The lender wants its devices again: True (and held again) when none of them is
        held by another attempt now; False leaves it lent."""
        found = self._holders.get(holder)
        if found is None:
            return False
        if not found.lent:
            return True
        for node, indices in found.held.items():
            taken, _ = self._in_use(node, but=holder)
            if taken & set(indices):
                return False
        found.lent = False
        return True

    def _in_use(self, node: str, but: str = "") -> tuple[set[int], set[int]]:
        """Indices of `node` held by attempts (not lent), and by lenders."""
        taken: set[int] = set()
        lent: set[int] = set()
        for name, h in self._holders.items():
            if name != but:
                (lent if h.lent else taken).update(h.held.get(node, ()))
        return taken, lent

    def _holders_on(self, node: str) -> list[str]:
        return sorted(n for n, h in self._holders.items() if node in h.held and not h.lent)


def _busy(node: str, count: int, free: list[int], holders: list[str]) -> str:
    held_by = ", ".join(holders) or "nobody"
    return f"{count} device(s) of {node} asked for, {len(free)} free (held by {held_by})"
