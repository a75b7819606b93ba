"""The job spec: what a job YAML (and the body of `POST /api/v1/jobs`) holds.

Imports only pydantic and the core, so the CLI validates a job file before anything
goes over the wire and points at the line and field of a mistake:

    spec = load_job_file(Path("job.yaml"), cwd=Path.cwd())
    # ConfigError: job.yaml:4 field 'nproc_per_node': Input should be greater than 0 ...

An `elastic` block lets the scheduler resize the job between `min_nnodes` and
`max_nnodes` nodes through its checkpoint (grow into devices a tidal service lends,
shrink before the service's peak): docs/tidal.md.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from argosy.core.documents import load_yaml, validate
from argosy.core.errors import ArgosyError, ConfigError

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$"


STRICT = ConfigDict(extra="forbid", frozen=True, strict=True, use_attribute_docstrings=True)
"""Specs take values as typed: no bool or float for an int, no number for a string (a
YAML or JSON int for an int field, a string for a string field); unknown keys refused."""


class ElasticSpec(BaseModel):
    """The range of nodes an elastic job may run on (each with `nproc_per_node` ranks)."""

    model_config = STRICT

    min_nnodes: int = Field(default=1, ge=1, le=1024)
    """Fewest nodes the job runs on; it is never shrunk below them."""
    max_nnodes: int = Field(ge=1, le=1024)
    """Most nodes the job grows to when devices are idle (lent by a tidal service)."""

    @model_validator(mode="after")
    def _ordered(self) -> ElasticSpec:
        if self.min_nnodes > self.max_nnodes:
            raise ValueError(
                f"min_nnodes ({self.min_nnodes}) is more than max_nnodes ({self.max_nnodes})"
            )
        return self


MAX_ARG_CHARS = 16 * 1024
"""The longest one argument of a job may be."""
MAX_ARGS_CHARS = 64 * 1024
"""The most all of a job's arguments together may be."""
MAX_ENTRY_CHARS = 256
"""The longest a `chips` or `inject` entry may be."""


class JobSpec(BaseModel):
    """A training job: a script run as `nproc_per_node` ranks by `argosy launch`."""

    model_config = STRICT

    name: str = Field(pattern=NAME_PATTERN)
    """Job name (letters, digits, `.`, `_`, `-`); need not be unique."""
    queue: str = Field(default="default", min_length=1, max_length=100)
    """Leaf queue the job is submitted to."""
    script: str = Field(min_length=1, max_length=4096)
    """Training script (.py) or executable; relative paths resolve against `workdir`."""
    args: list[str] = Field(default_factory=list, max_length=1000)
    """Arguments passed to the script."""
    nproc_per_node: int = Field(default=1, ge=1, le=1024)
    """Ranks per node, one device each."""
    nnodes: int = Field(default=1, ge=1, le=1024)
    """Nodes of the gang (all start together or none does)."""
    exact_nodes: bool = False
    """Run on exactly `nnodes` distinct nodes with `nproc_per_node` devices each (one rank
    per node needs it); false: the scheduler packs the nnodes x nproc_per_node devices
    onto as few nodes as hold them. Fixed-size jobs only (not with `elastic`)."""
    chips: list[str] = Field(default_factory=list, max_length=32)
    """Chip types the job accepts (catalog names); empty: any chip the cluster has."""
    checkpoint_every: int | None = Field(default=None, ge=1)
    """Steps between checkpoints, handed to the script as ARGOSY_CHECKPOINT_EVERY."""
    max_restarts: int = Field(default=3, ge=0, le=100)
    """Restarts of the ranks inside one attempt (`argosy launch`), and new attempts after
    an attempt is lost (its process killed, its node gone)."""
    priority: int = Field(default=0, ge=-1000, le=1000)
    """Higher runs first within the fair-share order."""
    workdir: str | None = Field(default=None, max_length=4096)
    """Directory the job runs in; the CLI sends the submitting directory."""
    inject: list[str] = Field(default_factory=list, max_length=16)
    """Faults injected into the job's first attempt, in `argosy launch --inject` form
    (`kill:rank=1:step=30`, `hang:rank=0:step=20`, ...): to rehearse recovery."""

    elastic: ElasticSpec | None = None
    """Resize range: the scheduler grows and shrinks the job between `min_nnodes` and
    `max_nnodes` nodes by stopping it (it checkpoints) and starting it again at the new
    size from its checkpoint; none: fixed at `nnodes`."""

    @field_validator("elastic")
    @classmethod
    def _range_holds_nnodes(cls, value: ElasticSpec | None, info: ValidationInfo) -> object:
        """The job's `nnodes` lies within its elastic range."""
        nnodes = info.data.get("nnodes")
        if value is not None and info.data.get("exact_nodes"):
            raise ValueError("exact_nodes is for fixed-size jobs; an elastic job is packed")
        if (
            value is not None
            and nnodes is not None
            and not (value.min_nnodes <= nnodes <= value.max_nnodes)
        ):
            raise ValueError(
                f"nnodes ({nnodes}) is outside min_nnodes..max_nnodes "
                f"({value.min_nnodes}..{value.max_nnodes})"
            )
        return value

    @field_validator("args", mode="before")
    @classmethod
    def _scalars_as_text(cls, value: object) -> object:
        """`args: [--steps, 60]` is what people write: numbers become their text."""
        if isinstance(value, list):
            return [
                str(v) if isinstance(v, int | float) and not isinstance(v, bool) else v
                for v in value
            ]
        return value

    @field_validator("args")
    @classmethod
    def _args_fit(cls, value: list[str]) -> list[str]:
        """Each argument at most `MAX_ARG_CHARS`, all of them `MAX_ARGS_CHARS`: a spec is
        stored and shown, so its size is bounded (a file is the place for more)."""
        for i, arg in enumerate(value):
            if len(arg) > MAX_ARG_CHARS:
                raise ValueError(
                    f"argument {i} is {len(arg)} characters; at most {MAX_ARG_CHARS} each"
                    " (pass a file for more)"
                )
        total = sum(len(a) for a in value)
        if total > MAX_ARGS_CHARS:
            raise ValueError(
                f"the arguments are {total} characters in all; at most {MAX_ARGS_CHARS}"
                " (pass a file for more)"
            )
        return value

    @field_validator("chips", "inject")
    @classmethod
    def _entries_short(cls, value: list[str], info: ValidationInfo) -> list[str]:
        """A chip name or an injection is at most `MAX_ENTRY_CHARS`."""
        for i, entry in enumerate(value):
            if len(entry) > MAX_ENTRY_CHARS:
                raise ValueError(
                    f"{info.field_name} entry {i} is {len(entry)} characters;"
                    f" at most {MAX_ENTRY_CHARS}"
                )
        return value

    @field_validator("inject")
    @classmethod
    def _injections_parse(cls, value: list[str], info: ValidationInfo) -> list[str]:
        """Every `inject` entry is a valid injection for this job's ranks (an error points
        at the `inject` field, not the whole job)."""
        from argosy.runtime.inject import parse_injection

        nproc, nnodes = info.data.get("nproc_per_node"), info.data.get("nnodes")
        if nproc is None or nnodes is None:
            return value  # their own errors say why
        for entry in value:
            try:
                parse_injection(entry, nproc * nnodes)
            except ArgosyError as err:
                raise ValueError(str(err)) from None
        return value

    @property
    def devices(self) -> int:
        return self.nproc_per_node * self.nnodes

    @property
    def device_range(self) -> tuple[int, int]:
        """(fewest, most) devices the job runs on: its elastic range, else `devices`."""
        if self.elastic is None:
            return self.devices, self.devices
        per = self.nproc_per_node
        return self.elastic.min_nnodes * per, self.elastic.max_nnodes * per


def load_job_file(path: Path, cwd: Path) -> JobSpec:
    """Validate a job YAML; a relative script resolves against `cwd`, which becomes the
    job's working directory unless the file names one."""
    doc = load_yaml(path)
    if not isinstance(doc.data, dict):
        raise ConfigError("a job file is a mapping of keys to values", source=str(path), line=1)
    if doc.data.get("kind") == "job":  # the marker `argosy submit` reads, not a spec field
        doc = dataclasses.replace(doc, data={k: v for k, v in doc.data.items() if k != "kind"})
    spec = validate(JobSpec, doc)
    workdir = Path(spec.workdir) if spec.workdir else cwd
    if not workdir.is_absolute():
        workdir = cwd / workdir
    script = Path(spec.script)
    if not script.is_absolute() and (workdir / script).exists():
        script = workdir / script
    return spec.model_copy(update={"script": str(script), "workdir": str(workdir.resolve())})
