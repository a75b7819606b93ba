"""Sample-weighted gradient averaging: a mixed step equals a uniform step. Pure.

Ranks of a mixed launch take different numbers of sequences per step. If each rank's
loss is the mean over its own sequences, the gradient of the global-batch mean loss is

    grad = sum_r (samples_r / global_batch) * grad_r

so each rank scales its local gradient by its weight, and the all-reduce sums. A plain
average (divide by world size) would over-weight the ranks with few sequences.

Micro-batches inside a rank are accumulated the same way: each micro-batch's mean loss
is scaled by (its sequences / the rank's sequences) before backward.

    w = rank_weights([16, 8, 8])          # [0.5, 0.25, 0.25]
    loss_scale = micro_batch_scales(11, 4)  # [4/11, 4/11, 3/11]
"""

from __future__ import annotations


def rank_weights(samples: list[int]) -> list[float]:
    """Each rank's share of the gradient average (sums to 1)."""
    total = sum(samples)
    if total <= 0 or any(s < 0 for s in samples):
        raise ValueError(f"samples per rank {samples}: need non-negative counts, some positive")
    return [s / total for s in samples]


def micro_batch_sizes(samples: int, micro_batch: int) -> list[int]:
    """Sizes of the micro-batches a rank runs for `samples` sequences (last may be short)."""
    if micro_batch < 1:
        raise ValueError(f"micro_batch {micro_batch} < 1")
    full, rest = divmod(samples, micro_batch)
    return [micro_batch] * full + ([rest] if rest else [])


def micro_batch_scales(samples: int, micro_batch: int) -> list[float]:
    """Loss scale per micro-batch so their summed gradients are the rank's mean gradient."""
    return [size / samples for size in micro_batch_sizes(samples, micro_batch)]
