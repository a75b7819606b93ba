"""The service spec: what a service YAML (and the body of `POST /api/v1/services`) holds.

A service is an inference endpoint: `replicas` processes of `argosy serve`, one device
each, placed by the scheduler like jobs and restarted when they exit. Imports only
pydantic and the core (engine and speculative names are checked against the serving
registries, imported when a spec is validated, without torch), so the CLI validates a
file before anything goes over the wire:

    doc = load_yaml(Path("svc.yaml"))
    kind = document_kind(doc)            # "service" (a `kind: service` or a `model` key)
    spec = validate(ServiceSpec, doc)    # ConfigError: svc.yaml:3 field 'replicas': ...

A `tidal` block makes the service lend its idle replicas' devices to elastic training
between its peaks (docs/tidal.md): `levels` is its load over one `period_s` as fractions
of the peak, and the replicas are awake again `lead_s` before the forecast rises.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Annotated, Literal

from pydantic import BaseModel, Field, ValidationInfo, field_validator

from argosy.core.documents import Document
from argosy.core.errors import ConfigError, UnknownNameError
from argosy.server.spec import NAME_PATTERN, STRICT

SPECULATIVE_NAME = re.compile(r"[a-z0-9_-]{1,32}")
Level = Annotated[float, Field(ge=0.0, le=1.0)]


class TidalSpec(BaseModel):
    """A service's load forecast: its idle replicas yield their devices at the trough and
    are awake again `lead_s` before the forecast rises."""

    model_config = STRICT

    levels: list[Level] = Field(min_length=1, max_length=10_000)
    """Load over one period as fractions of the peak (0 to 1), evenly spaced; the replicas
    needed at a level are ceil(replicas x level)."""
    period_s: float = Field(default=86400.0, gt=0, le=365 * 86400.0)
    """Seconds the levels cover; the period repeats and starts at every multiple of
    `period_s` since the epoch (86400: a day from 00:00 UTC; a test compresses it)."""
    offset_s: float = Field(default=0.0, ge=0, le=365 * 86400.0)
    """The period starts this long after each multiple of `period_s` since the epoch (a
    daily profile in local time: its UTC offset); rounded to whole steps."""
    lead_s: float = Field(default=1800.0, ge=0, le=365 * 86400.0)
    """Seconds before the forecast rises by which the replicas it needs are awake."""
    min_replicas: int = Field(default=0, ge=0, le=256)
    """Replicas that stay awake whatever the forecast."""
    sleep_level: int = Field(default=2, ge=1, le=2)
    """`/admin/sleep` level of a yielding replica: 1 keeps its worker (faster wake), 2
    stops it (frees more memory)."""

    def profile(self, replicas: int) -> list[float]:
        """The levels with the `min_replicas` floor applied (fractions of `replicas`), from
        each multiple of `period_s` since the epoch (`offset_s` rotates them)."""
        floor = self.min_replicas / replicas
        shift = round(self.offset_s / self.step_s) % len(self.levels)
        levels = self.levels[-shift:] + self.levels[:-shift] if shift else self.levels
        return [max(level, floor) for level in levels]

    @property
    def step_s(self) -> float:
        """Seconds each level covers."""
        return self.period_s / len(self.levels)


class ServiceSpec(BaseModel):
    """An inference service: `replicas` copies of `argosy serve --model M`."""

    model_config = STRICT

    kind: Literal["service"] = "service"
    """Marks the file as a service for `argosy submit` (optional)."""
    name: str = Field(pattern=NAME_PATTERN)
    """Service name (letters, digits, `.`, `_`, `-`); need not be unique."""
    queue: str = Field(default="default", min_length=1, max_length=100)
    """Leaf queue whose quota the replicas use."""
    model: str = Field(default="smollm2-135m", min_length=1, max_length=4096)
    """Model served (`argosy serve --model`): a catalog name or the path (with a `/`) of a
    checkpoint directory on the replicas' nodes; an unknown name is refused."""
    engine: str = Field(default="transformers", min_length=1, max_length=64)
    """Serving engine (`argosy serve --engine`): transformers (alias hf) or vllm; an
    unknown name is refused with the known ones."""
    speculative: str = Field(default="auto", min_length=1, max_length=4200)
    """Speculative decoding (`argosy serve --speculative`): off or a registered method
    (ngram, auto, self[:K], draft:PATH and their aliases); an unknown name is refused, and
    `draft` needs the absolute path of its checkpoint on the replicas' nodes."""
    threads: int = Field(default=0, ge=0, le=1024)
    """torch threads per replica (`argosy serve --threads`); 0: the engine's default."""
    replicas: int = Field(default=1, ge=1, le=256)
    """Replicas, one device each; the scheduler places each on its own."""
    chips: list[str] = Field(default_factory=list, max_length=32)
    """Chip types the replicas accept (catalog names); empty: any chip the cluster has."""
    port: int = Field(default=0, ge=0, le=65535)
    """Port of replica 0 (replica i listens on port + i); 0: a free port per replica."""
    max_restarts: int = Field(default=10, ge=0, le=10_000)
    """Restarts of one replica after it exits or fails its health probes, before the
    service is failed."""
    priority: int = Field(default=0, ge=-1000, le=1000)
    """Priority of the service's workload in its queue."""
    memory_fraction: float | None = Field(default=None, gt=0, le=1)
    """Share of its device's memory each replica may use (`argosy serve
    --memory-fraction`, 0 < F <= 1: its KV cache is sized from it); none: no budget."""
    tidal: TidalSpec | None = None
    """Load forecast that lets idle replicas lend their devices to elastic training
    (none: every replica stays awake)."""

    @field_validator("model")
    @classmethod
    def _no_nul(cls, value: str) -> str:
        """The model is one argument of `argosy serve`, which no NUL byte can be part of."""
        if "\0" in value:
            raise ValueError("holds a NUL byte, which no path or argument can hold")
        return _known_model(value)

    @field_validator("engine")
    @classmethod
    def _known_engine(cls, value: str) -> str:
        """An engine `argosy serve` knows (the serving registry, loaded lazily)."""
        from argosy.serving.engine import ENGINES

        return _known(value, ENGINES.canonical)

    @field_validator("speculative")
    @classmethod
    def _known_method(cls, value: str) -> str:
        """`off` or a registered speculative proposer, with the argument it needs."""
        from argosy.serving.speculative import PROPOSERS, check_name, split_spec

        name, arg = value.partition(":")[0], split_spec(value)[1]
        if not SPECULATIVE_NAME.fullmatch(name):
            raise ValueError(f"'{name}' is not a method name (lowercase letters, digits, _ -)")
        _known(value, check_name)
        _speculative_arg(PROPOSERS.canonical(name) if name != "off" else name, arg)
        return value

    @field_validator("tidal")
    @classmethod
    def _floor_within_replicas(cls, value: TidalSpec | None, info: ValidationInfo) -> object:
        """`min_replicas` cannot exceed `replicas`."""
        replicas = info.data.get("replicas")
        if value is not None and replicas is not None and value.min_replicas > replicas:
            raise ValueError(
                f"min_replicas ({value.min_replicas}) is more than replicas ({replicas})"
            )
        return value


def _known_model(value: str) -> str:
    """A catalog name, or a path (with a `/`) of a checkpoint directory on the replicas'
    nodes, which `argosy serve` checks there; a bare name the catalog lacks is refused at
    submit, listing the catalog."""
    from argosy.serving.models import CATALOG

    if value in CATALOG or "/" in value or value.startswith("~"):
        return value
    known = ", ".join(sorted(CATALOG))
    raise ValueError(
        f"unknown model '{value}': use one of {known} or the path of a checkpoint "
        "directory on the replicas' nodes (with a '/')"
    )


def _speculative_arg(method: str, arg: str | None) -> None:
    """The text after the colon: `draft` needs an absolute checkpoint path (read on the
    replica's node, where `argosy serve` checks it before loading), `self` an optional
    depth; the other methods take none."""
    if method == "draft":
        if not arg or not arg.startswith("/") or "\0" in arg:
            raise ValueError(
                "'draft' needs the absolute path of a checkpoint on the replicas' nodes: "
                "draft:/PATH"
            )
    elif method == "self":
        if arg is not None and not (arg.isdigit() and 0 < int(arg) < 10_000):
            raise ValueError(f"'self:{arg}': the depth is a whole number of layers, self:K")
    elif arg is not None:
        raise ValueError(f"'{method}' takes no argument (got ':{arg}')")


def _known(value: str, check: Callable[[str], object]) -> str:
    """`value` when `check` accepts it; else the registry's message, which lists the
    known names."""
    try:
        check(value)
    except UnknownNameError as err:
        raise ValueError(str(err)) from None
    return value


def document_kind(doc: Document) -> str:
    """ "service" or "job": a `kind` key says which; otherwise a `model` key without a
    `script` marks a service."""
    data = doc.data
    if not isinstance(data, dict):
        raise ConfigError("a job or service file is a mapping of keys to values", source=doc.source)
    kind = data.get("kind")
    if kind is None:
        return "service" if "model" in data and "script" not in data else "job"
    if kind not in ("job", "service"):
        raise ConfigError(
            f"unknown kind '{kind}'; known: job, service",
            source=doc.source,
            line=doc.line_of(("kind",)),
            field="kind",
        )
    return str(kind)
