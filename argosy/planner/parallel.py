"""A parallel configuration: degrees, micro-batch, recompute and ZeRO stage.

`Parallel` is one configuration; `Candidates` holds many as numpy columns so the cost
model evaluates them all at once. `parse_parallel` reads the CLI form

    tp=8,pp=16,dp=24,vpp=1,mbs=1,recompute=selective,zero=1[,cp=1,ep=1,etp=0,sp=1,flash=1,compile=1,fp8=1,recompute_layers=0]

(`flash` left out means the framework's default kernel: see `given_keys`;
`recompute_layers=k` with `recompute=full` recomputes only the first k layers of each
model chunk, Megatron's `--recompute-method block`; 0 means every layer; `etp` is the
tensor-parallel degree of the routed experts, 0 meaning tp: with etp=1 the experts are
whole on each device and ep may take ranks from TP, Megatron's MoE parallel folding), and
`check_parallel` raises `ArgosyError` for degrees that cannot work (product not the
device count, TP not dividing the heads, ...).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

import numpy as np

from argosy.core.errors import ArgosyError, ConfigError
from argosy.planner.models import ModelSpec

RECOMPUTE = ("none", "selective", "full")
BOOL_KEYS = ("sp", "flash", "compile", "fp8")
INT_KEYS = ("tp", "pp", "dp", "vpp", "cp", "ep", "etp", "mbs", "zero", "recompute_layers")
ZERO_ALLOWED = ("zero", "recompute_layers", "etp")  # integer keys that may be 0
PARALLEL_FORM = (
    "tp=8,pp=16,dp=24,vpp=1,mbs=1,recompute=selective,zero=1"
    "[,cp=1,ep=1,etp=0,sp=1,flash=1,compile=1,fp8=1,recompute_layers=0]"
)


@dataclass(frozen=True)
class Parallel:
    """One parallel configuration of one model replica set."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    vpp: int = 1
    mbs: int = 1
    recompute: str = "selective"
    zero: int = 1
    cp: int = 1
    ep: int = 1
    etp: int = 0
    """Tensor-parallel degree of the routed experts: 0 means tp (Megatron's default)."""
    sp: bool = True
    flash: bool = True
    compile: bool = False
    fp8: bool = False
    recompute_layers: int = 0
    """With recompute=full: layers of each model chunk recomputed (block method); 0: all."""

    @property
    def devices(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    @property
    def expert_tp(self) -> int:
        """Tensor-parallel degree the routed experts run with."""
        return self.etp or self.tp

    @property
    def partial_recompute(self) -> bool:
        """Full recompute of only some layers of each model chunk."""
        return self.recompute == "full" and self.recompute_layers > 0

    def as_dict(self) -> dict[str, object]:
        return asdict(self)

    def text(self) -> str:
        """The `--parallel` form of this configuration (`recompute_layers` and `etp` only
        when set)."""
        items = asdict(self).items()
        optional = ("recompute_layers", "etp")
        return ",".join(f"{k}={str(v).lower()}" for k, v in items if k not in optional or v)


def recompute_label(recompute: str, layers: int = 0) -> str:
    """'none', 'selective', 'full', or 'full:k' for the first k layers of each chunk."""
    return f"{recompute}:{layers}" if recompute == "full" and layers else recompute


def parse_parallel(text: str) -> Parallel:
    """Parse the `--parallel` form; unknown keys and bad values raise `ConfigError`."""
    known = {f.name for f in fields(Parallel)}
    values: dict[str, object] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, raw = part.partition("=")
        key = key.strip()
        if not sep or key not in known:
            raise ConfigError(
                f"'{part}' is not one of {', '.join(sorted(known))}; expected {PARALLEL_FORM}",
                source=text,
            )
        if key in values:
            raise ConfigError(f"'{key}' is given twice; give each key once", source=text, field=key)
        values[key] = _value(key, raw.strip(), text)
    if "sp" not in values:
        values["sp"] = int(values.get("tp", 1)) > 1
    return Parallel(**values)  # type: ignore[arg-type]


def given_keys(text: str) -> set[str]:
    """The keys the `--parallel` text sets explicitly."""
    return {p.partition("=")[0].strip() for p in text.split(",") if "=" in p}


def _value(key: str, raw: str, text: str) -> object:
    if key == "recompute":
        if raw not in RECOMPUTE:
            raise ConfigError(
                f"recompute={raw!r}; expected one of {', '.join(RECOMPUTE)}", source=text, field=key
            )
        return raw
    if key in BOOL_KEYS:
        return raw.lower() in ("1", "true", "yes", "on")
    if not raw.isdigit() or int(raw) < (0 if key in ZERO_ALLOWED else 1):
        raise ConfigError(f"{key}={raw!r} is not a positive integer", source=text, field=key)
    if key == "zero" and int(raw) > 3:
        raise ConfigError(f"zero={raw} must be 0, 1, 2 or 3", source=text, field=key)
    return int(raw)


def check_parallel(
    p: Parallel, model: ModelSpec, devices: int, seq_len: int, global_batch: int
) -> None:
    """Raise `ArgosyError` naming the first impossible degree."""
    if p.devices != devices:
        raise ArgosyError(
            f"tp*pp*dp*cp = {p.tp}*{p.pp}*{p.dp}*{p.cp} = {p.devices}, "
            f"but the cluster has {devices} devices"
        )
    if model.heads % p.tp or model.kv % p.tp:
        raise ArgosyError(f"tp={p.tp} must divide heads={model.heads} and kv_heads={model.kv}")
    if p.pp * p.vpp > model.layers:
        raise ArgosyError(f"pp*vpp = {p.pp * p.vpp} exceeds the model's {model.layers} layers")
    if p.vpp > 1 and p.pp == 1:
        raise ArgosyError("vpp > 1 needs pp > 1")
    chunk = -(-model.layers // (p.pp * p.vpp))
    if p.recompute_layers and (p.recompute != "full" or p.recompute_layers >= chunk):
        raise ArgosyError(
            f"recompute_layers={p.recompute_layers} needs recompute=full and fewer than the "
            f"{chunk} layers of a model chunk (0 recomputes them all)"
        )
    if seq_len % (2 * p.cp) and p.cp > 1:
        raise ArgosyError(f"cp={p.cp}: seq-len {seq_len} must be divisible by 2*cp")
    if p.etp not in (0, 1, p.tp):
        raise ArgosyError(f"etp={p.etp} must be 1 or tp={p.tp} (0 means tp)")
    if p.ep > 1 and (not model.is_moe or model.experts % p.ep):
        raise ArgosyError(f"ep={p.ep} must divide experts={model.experts}")
    group = expert_holders(p.dp, p.cp, p.tp, p.etp)
    if p.ep > 1 and group % p.ep:
        raise ArgosyError(
            f"ep={p.ep} must divide dp*cp*tp/etp = {group} (the ranks that hold different "
            "experts; etp=1 lets ep take ranks from TP)"
        )
    if global_batch % (p.dp * p.mbs):
        raise ArgosyError(
            f"global batch {global_batch} is not a multiple of dp*mbs = {p.dp * p.mbs}"
        )


def expert_holders(dp: int, cp: int, tp: int, etp: int) -> int:
    """Ranks of one pipeline stage that can hold different routed experts, dp*cp*tp/etp
    (`etp` 0 meaning tp): ep must divide it (Megatron's MoE parallel folding)."""
    return dp * cp * tp // (etp or tp)


@dataclass
class Candidates:
    """Many configurations as equal-length numpy columns (recompute as 0/1/2)."""

    tp: np.ndarray
    pp: np.ndarray
    dp: np.ndarray
    vpp: np.ndarray
    mbs: np.ndarray
    recompute: np.ndarray
    zero: np.ndarray
    cp: np.ndarray
    ep: np.ndarray
    etp: np.ndarray
    sp: np.ndarray
    flash: np.ndarray
    compile: np.ndarray
    fp8: np.ndarray
    recompute_layers: np.ndarray

    def __len__(self) -> int:
        return len(self.tp)

    @classmethod
    def of(cls, plans: list[Parallel]) -> Candidates:
        cols = {f.name: [getattr(p, f.name) for p in plans] for f in fields(Parallel)}
        cols["recompute"] = [RECOMPUTE.index(r) for r in cols["recompute"]]
        bools = BOOL_KEYS
        return cls(
            **{k: np.asarray(v, dtype=bool if k in bools else np.int64) for k, v in cols.items()}
        )

    def concat(self, other: Candidates) -> Candidates:
        return Candidates(
            **{
                f.name: np.concatenate([getattr(self, f.name), getattr(other, f.name)])
                for f in fields(Parallel)
            }
        )

    @property
    def expert_tp(self) -> np.ndarray:
        """Tensor-parallel degree the routed experts run with (etp, or tp where 0)."""
        return np.where(self.etp > 0, self.etp, self.tp)

    def recompute_share(self, layers: int) -> np.ndarray:
        """Share of each model chunk's layers recomputed in full: 1 for recompute=full
        over every layer, k/chunk for the block method's first k, 0 otherwise."""
        chunk = np.ceil(layers / (self.pp * self.vpp))
        partial = np.minimum(self.recompute_layers / chunk, 1.0)
        share = np.where(self.recompute_layers > 0, partial, 1.0)
        return np.where(self.recompute == 2, share, 0.0)

    def take(self, index) -> Candidates:
        return Candidates(**{f.name: getattr(self, f.name)[index] for f in fields(Parallel)})

    def plan(self, i: int) -> Parallel:
        values = {f.name: getattr(self, f.name)[i].item() for f in fields(Parallel)}
        values["recompute"] = RECOMPUTE[int(values["recompute"])]
        return Parallel(**values)
