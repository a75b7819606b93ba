"""The draft's training loop reports progress within its budget and raises no torch
warning (the loss is read detached)."""

from __future__ import annotations

import time
import warnings

import torch
from tiny_llama import tiny_llama

from argosy.serving.draft_training import _fit


def test_fit_reports_within_the_budget_without_warnings() -> None:
    torch.set_num_threads(1)
    model = tiny_llama(48).train()
    sequences = [[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12]]
    labels = [torch.tensor(s[1:] + [0]) for s in sequences]
    reports: list[tuple[str, int, int]] = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        steps, loss = _fit(
            model, sequences, labels, time.perf_counter() + 1.2, lambda *r: reports.append(r)
        )
    assert steps >= 1 and loss == loss
    assert all(done <= total for _, done, total in reports), reports
