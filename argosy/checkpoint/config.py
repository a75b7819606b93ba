"""Config section of the checkpoint layer: where snapshots go and how many are kept."""

from pydantic import BaseModel, ConfigDict, Field


class CheckpointConfig(BaseModel):
    """Defaults of `FlashCheckpointer.from_config` and `argosy ckpt`."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    directory: str = "checkpoints"
    """Where durable steps are written (one DCP directory per step)."""
    keep: int = Field(3, ge=1)
    """Durable steps kept on disk; older ones are pruned after each commit."""
    slots: int = Field(2, ge=1)
    """Shared-memory snapshot slots per rank: 2 keep the newest complete snapshot intact
    while the next one is copied; 1 halves the memory but a save waits for the persist."""
    linger_s: float = Field(300.0, ge=0)
    """Seconds an orphaned persister keeps its snapshots in memory for a restarted trainer."""
    commit_timeout_s: float = Field(300.0, gt=0)
    """Seconds rank 0 waits for every rank's files of a step before giving that step up."""
    persist_interval_s: float = Field(0.0, ge=0)
    """Least seconds between two disk writes: memory snapshots still happen at every save;
    0 writes the newest snapshot whenever the previous write is done. `wait()` and a dying
    trainer write at once."""
    inline_bytes: int = Field(65536, ge=0)
    """Tensors up to this size travel inline with each save instead of by shared handle."""
