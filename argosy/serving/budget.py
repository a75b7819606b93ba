"""Memory fractions: several services on one device, each within its share.

A service started with `--memory-fraction F` (0 < F <= 1) owns F x the device's memory
(CUDA: the device's total; CPU: the host's MemTotal). Three pieces, the first two pure:

- `MemoryBudget`: F x device bytes, less the weights and an activation reserve, is the KV
  budget; divided by the KV bytes of one token it gives the KV capacity in tokens, which
  the batch loop admits requests against (`kv_tokens_needed`). Weights that alone do not
  fit are refused (`check`).
- `DeviceShares`: the fractions placed on one device; a claim that would push the sum over
  1.0 is refused with a `ShareError` naming the field and the device's current sum.
- `DeviceLedger`: the same shares kept in a file per device under a lock, so separate
  `argosy serve` processes of one user on one node see each other's claims; a claim
  lives as long as the process that made it (dead processes' claims, and those whose
  pid a later process took, are dropped when the file is read).

Where (`ledger_dir`): `$ARGOSY_DEVICE_LEDGER_DIR` when set; else a directory of this
user's own, `$XDG_RUNTIME_DIR/argosy-devices` when that runtime directory is this user's
and closed to others, else `<tmp>/argosy-devices-<uid>`. The ledger is therefore per
user: services of different users on one device do not see each other's shares. A
shared name (`/tmp/argosy-devices`) would let whoever made it first (another tenant, or
root in an earlier run) fail every other user's service; should another user hold the
per-user name, a fresh private directory is used instead, with a warning (this process's
services then do not see the shares of this user's other processes). The directory must
be this user's and closed to others (created 0700; a `$ARGOSY_DEVICE_LEDGER_DIR` another
user made first, or a symlink, is refused naming it); files in it are opened without
following symlinks and replaced through a fresh temporary name, so a link planted in a
shared /tmp cannot make a claim write elsewhere.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import stat
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from argosy.core.errors import ArgosyError
from argosy.core.own_files import open_own, own_directory, private_directory
from argosy.core.procs import pid_alive, start_ticks

FIELD = "memory_fraction"
RESERVE_FRACTION = 0.1
"""Share of the budget kept for activations and workspace (logits of a wide verify pass,
attention scratch); the rest after the weights is the KV budget."""
_EPS = 1e-9


class ShareError(ArgosyError):
    """A memory fraction that does not fit: out of range, or the device is full."""

    def __init__(self, message: str, current_sum: float | None = None) -> None:
        self.field = FIELD
        self.current_sum = current_sum
        super().__init__(message)


def check_fraction(value: Any) -> float:
    """`value` as a fraction in (0, 1], else a `ShareError` naming the field."""
    try:
        fraction = float(value)
    except (TypeError, ValueError):
        raise ShareError(f"{FIELD} must be a number in (0, 1], not {value!r}") from None
    if not 0 < fraction <= 1:  # also false for NaN
        raise ShareError(f"{FIELD} must be in (0, 1], not {value!r}")
    return fraction


# -- one service's budget ------------------------------------------------------------------
@dataclass(frozen=True)
class MemoryBudget:
    """A service's share of a device and the KV capacity it leaves after the weights."""

    fraction: float
    device_bytes: int
    weights_bytes: int
    kv_bytes_per_token: int

    @property
    def budget_bytes(self) -> int:
        """F x the device's memory."""
        return int(self.fraction * self.device_bytes)

    @property
    def reserve_bytes(self) -> int:
        """Kept for activations and workspace."""
        return int(RESERVE_FRACTION * self.budget_bytes)

    @property
    def kv_budget_bytes(self) -> int:
        """What is left for KV caches after the weights and the reserve."""
        return max(0, self.budget_bytes - self.weights_bytes - self.reserve_bytes)

    @property
    def kv_capacity_tokens(self) -> int:
        """Cached token positions (all requests, padding included) the KV budget holds."""
        return self.kv_budget_bytes // max(1, self.kv_bytes_per_token)

    def check(self) -> None:
        """Refuse a budget that cannot hold the weights and the reserve."""
        if self.weights_bytes + self.reserve_bytes > self.budget_bytes:
            raise ShareError(
                f"{FIELD} {self.fraction:g} of {_gib(self.device_bytes)} gives "
                f"{_gib(self.budget_bytes)}; the weights alone take "
                f"{_gib(self.weights_bytes)} (+{_gib(self.reserve_bytes)} reserve): "
                f"raise {FIELD} to at least {self.min_fraction():.3f}"
            )

    def min_fraction(self) -> float:
        """The least fraction that holds the weights and the reserve (no KV)."""
        return self.weights_bytes / ((1 - RESERVE_FRACTION) * self.device_bytes)

    def as_dict(self) -> dict[str, float | int]:
        """The figures `/admin/state` reports."""
        return {
            "memory_fraction": self.fraction,
            "device_bytes": self.device_bytes,
            "budget_bytes": self.budget_bytes,
            "weights_bytes": self.weights_bytes,
            "reserve_bytes": self.reserve_bytes,
            "kv_budget_bytes": self.kv_budget_bytes,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "kv_capacity_tokens": self.kv_capacity_tokens,
        }


def kv_tokens_needed(lengths: list[int]) -> int:
    """Cached positions a batch of requests of at most `lengths` tokens may hold: the
    batched cache is left-padded to its longest row, and rejected draft positions (holes)
    may waste up to a quarter of the width (at least 16) before it is compacted."""
    if not lengths:
        return 0
    longest = max(lengths)
    if len(lengths) == 1:
        return longest
    return len(lengths) * (longest + max(16, longest // 4))


# -- fractions placed on one device -----------------------------------------------------
@dataclass
class DeviceShares:
    """The memory fractions placed on one device; their sum never exceeds 1."""

    device: str
    claims: dict[str, float] = field(default_factory=dict)

    @property
    def total(self) -> float:
        """The device's current sum of fractions."""
        return sum(self.claims.values())

    def add(self, claim_id: str, fraction: float) -> None:
        """Place a share; a `ShareError` (with the current sum) if it would not fit."""
        fraction = check_fraction(fraction)
        if claim_id in self.claims:
            raise ShareError(f"claim '{claim_id}' is already placed on {self.device}")
        current = self.total
        if current + fraction > 1 + _EPS:
            raise ShareError(
                f"{FIELD} {fraction:g} does not fit on device '{self.device}': its current "
                f"sum is {current:g} (of 1.0; {max(0.0, 1 - current):g} free)",
                current_sum=current,
            )
        self.claims[claim_id] = fraction

    def remove(self, claim_id: str) -> None:
        """Give a share back (unknown ids are ignored)."""
        self.claims.pop(claim_id, None)


# -- the node-local ledger ---------------------------------------------------------------
LEDGER_ENV = "ARGOSY_DEVICE_LEDGER_DIR"


def ledger_dir() -> Path:
    """Where this user's device ledgers live on this node: `$ARGOSY_DEVICE_LEDGER_DIR`,
    else a directory of this user's own (see the module docstring)."""
    env = os.environ.get(LEDGER_ENV)
    return Path(env) if env else _private_ledger_dir(default_ledger_dir())


def default_ledger_dir() -> Path:
    """`$XDG_RUNTIME_DIR/argosy-devices` when the runtime directory is this user's real
    directory, closed to others; else `<tmp>/argosy-devices-<uid>`."""
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    if os.path.isabs(runtime) and _private_to_me(runtime):
        return Path(runtime) / "argosy-devices"
    return Path(tempfile.gettempdir()) / f"argosy-devices-{os.geteuid()}"


def _private_to_me(path: str) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o077


@cache
def _private_ledger_dir(path: Path) -> Path:
    """`path`, or (another user holds it) one fresh private directory per process."""
    return private_directory(
        path, "this process's memory-fraction claims (unseen by the user's other services)"
    )


class DeviceLedger:
    """The shares of one device kept in `<dir>/<device>.json`, shared by processes."""

    def __init__(self, device: str, directory: Path | None = None) -> None:
        self.device = device
        self.directory = directory or ledger_dir()
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in device)
        self.path = self.directory / f"{safe}.json"

    def claim(self, fraction: float, name: str = "") -> str:
        """Place a share for this process; returns its id. `ShareError` if it does not fit."""
        claim_id = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        with self._locked() as records:
            shares = DeviceShares(self.device, {k: r["fraction"] for k, r in records.items()})
            shares.add(claim_id, fraction)
            records[claim_id] = {
                "fraction": fraction,
                "pid": os.getpid(),
                "start": start_ticks(os.getpid()),
                "name": name,
            }
        return claim_id

    def release(self, claim_id: str) -> None:
        """Give a share back."""
        with self._locked() as records:
            records.pop(claim_id, None)

    def total(self) -> float:
        """The device's current sum (live processes only)."""
        with self._locked() as records:
            return sum(r["fraction"] for r in records.values())

    @contextmanager
    def _locked(self) -> Iterator[dict[str, dict[str, Any]]]:
        _own_directory(self.directory)
        lock = _open_lock(self.path.with_suffix(".lock"))
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            records = _live(_read(self.path))
            yield records
            fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".ledger-", suffix=".tmp")
            with os.fdopen(fd, "w") as out:
                out.write(json.dumps(records))
            os.replace(tmp, self.path)  # replaces the name itself, never a link's target
        finally:
            os.close(lock)  # closing drops the lock


def _own_directory(directory: Path) -> None:
    """Create `directory` 0700, or check an existing one is this user's real directory
    and closed to others; `ArgosyError` naming the fix otherwise."""
    held = own_directory(directory)
    if held is None:
        return
    fix = f"set {LEDGER_ENV} to a directory of your own"
    if not stat.S_ISDIR(held.st_mode):
        raise ArgosyError(f"device ledger {directory} is not a directory (a link?); {fix}")
    raise ArgosyError(
        f"device ledger {directory} belongs to uid {held.st_uid}, not this user "
        f"({os.geteuid()}): its claims could be forged; {fix}"
    )


def _open_lock(path: Path) -> int:
    try:
        return open_own(path, os.O_RDWR | os.O_CREAT)
    except OSError as err:
        raise ArgosyError(f"device ledger file {path}: {err.strerror or err} (a link?)") from err


def _read(path: Path) -> dict[str, dict[str, Any]]:
    try:
        fd = open_own(path, os.O_RDONLY)
    except OSError:  # absent, a link or another user's: an empty ledger, rewritten as ours
        return {}
    try:
        with os.fdopen(fd) as handle:
            data = json.loads(handle.read())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _live(records: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {k: r for k, r in records.items() if _alive(int(r.get("pid", 0)), r.get("start"))}


def _alive(pid: int, start: Any = None) -> bool:
    """The claiming process still runs: its pid is alive (kill(0, 0) would signal this
    process group) and, when the claim recorded it, started when it did (a ledger that
    outlives a reboot must not keep a claim alive through a reused pid)."""
    if pid <= 0 or not pid_alive(pid):
        return False
    return start is None or start_ticks(pid) == start


def weights_bytes(path: Any, dtype_bytes: int = 4) -> int:
    """Bytes of a checkpoint's weights once held in a dtype of `dtype_bytes` per element
    (what the engine holds: a bf16 checkpoint served in fp32 takes twice its file size).
    Elements are counted from the safetensors headers; a `.bin` file counts as fp32."""
    elements = 0
    for file in sorted(Path(path).iterdir()):
        if file.suffix == ".safetensors":
            elements += _safetensors_elements(file)
        elif file.suffix == ".bin":
            elements += file.stat().st_size // 4
    return elements * dtype_bytes


def _safetensors_elements(file: Path) -> int:
    """Elements of every tensor in a safetensors file (its JSON header only is read)."""
    with open(file, "rb") as handle:
        size = int.from_bytes(handle.read(8), "little")
        header = json.loads(handle.read(size))
    total = 0
    for name, entry in header.items():
        if name != "__metadata__":
            total += math.prod(entry["shape"])
    return total


def kv_bytes_per_token(path: Any, dtype_bytes: int = 4) -> int:
    """KV cache bytes of one cached position: keys and values of every layer, in a dtype
    of `dtype_bytes` per element."""
    config = json.loads((Path(path) / "config.json").read_text())
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    return 2 * config["num_hidden_layers"] * kv_heads * head_dim * dtype_bytes


def host_memory_bytes() -> int:
    """The host's physical memory (MemTotal)."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _gib(num_bytes: int) -> str:
    return f"{num_bytes / 2**30:.2f} GiB"
