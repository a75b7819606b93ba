"""Train a small draft model for a served model from the model's own outputs (self-distillation).

The draft is the target's first `layers` decoder layers with the target's embeddings, final
norm and LM head (a copy: the served weights are never changed). Training data is made
here, with no download: prompts from built-in templates, continued greedily by the target;
labels are the target's own argmax next token at every position, so the draft learns to
agree with what verification will accept. Only the copied decoder layers and the final norm
are trained (the embedding/LM head stays the target's). Training stops after `max_seconds`
(at least one step).

The result is an HF checkpoint directory (written to a temporary sibling and renamed, so a
crash never leaves a half-written draft) with `argosy-draft.json`: the target, depth, steps,
and the held-out top-1 agreement with the target (the per-token acceptance a greedy
verifier would see on teacher-forced text). Serve it with `--speculative draft:PATH`.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

TOPICS = (
    "the ocean", "a lighthouse", "autumn", "a robot", "coffee", "the moon", "a library",
    "trains", "a small town", "mountains", "bees", "a storm", "friendship", "bread",
    "the desert", "winter", "music", "a garden", "rivers", "the city at night",
)  # fmt: skip
TASKS = (
    "Write a short story about {}.",
    "Write a poem about {}.",
    "Explain {} to a child.",
    "Give three facts about {}.",
    "Describe {} in a few sentences.",
    "Why do people like {}?",
)
MARKER = "argosy-draft.json"

Report = Callable[[str, int, int], None]
"""Progress callback: (phase, done, total)."""


@dataclass(frozen=True)
class DraftReport:
    """What a training run did and how well the draft agrees with the target."""

    target: str
    layers: int
    sequences: int
    steps: int
    seconds: float
    final_loss: float
    heldout_agreement: float
    """Share of held-out continuation positions where the draft's argmax is the target's."""


def make_prompts(tokenizer: Any, count: int) -> list[list[int]]:
    """`count` chat prompts from the templates, tokenized with the chat template."""
    texts = [TASKS[i % len(TASKS)].format(TOPICS[(i * 7) % len(TOPICS)]) for i in range(count)]
    return [
        list(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": text}],
                add_generation_prompt=True,
                tokenize=True,
                return_dict=False,
            )
        )
        for text in texts
    ]


def continue_greedily(
    model: Any, prompts: list[list[int]], new_tokens: int, report: Report
) -> list[list[int]]:
    """Prompt plus the target's greedy continuation, batched with left padding."""
    sequences = []
    batch = 8
    for start in range(0, len(prompts), batch):
        group = prompts[start : start + batch]
        width = max(len(p) for p in group)
        ids = torch.tensor([[0] * (width - len(p)) + p for p in group])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in group])
        with torch.inference_mode():
            out = model.generate(
                input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False,
                pad_token_id=0,
            )  # fmt: skip
        for row, prompt in enumerate(group):
            sequences.append(prompt + out[row, width:].tolist())
        report("generate", min(start + batch, len(prompts)), len(prompts))
    return sequences


def teacher_labels(model: Any, sequence: list[int]) -> torch.Tensor:
    """The target's argmax next token at every position of `sequence`."""
    with torch.no_grad():  # not inference_mode: the labels enter an autograd graph
        return model(input_ids=torch.tensor([sequence])).logits[0].argmax(-1)


def build_draft(target: Any, layers: int) -> Any:
    """A trainable copy of the target's first `layers` layers plus its head."""
    from argosy.serving.speculative.draft import early_exit_view

    draft = _deep_copy(early_exit_view(target, layers))
    for name, param in draft.named_parameters():
        param.requires_grad = name.startswith("model.layers.") or name.startswith("model.norm")
    return draft.train()


def train_draft(
    target_path: Path,
    out_dir: Path,
    layers: int = 2,
    num_prompts: int = 64,
    new_tokens: int = 48,
    max_seconds: float = 180.0,
    report: Report | None = None,
) -> DraftReport:
    """Distil a `layers`-layer draft from the checkpoint at `target_path` into `out_dir`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    report = report or (lambda phase, done, total: None)
    start = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(target_path)
    target = AutoModelForCausalLM.from_pretrained(target_path, dtype=torch.float32).eval()
    if not 1 <= layers < target.config.num_hidden_layers:
        raise ValueError(f"layers must be 1 to {target.config.num_hidden_layers - 1}")
    prompts = make_prompts(tokenizer, num_prompts)
    sequences = continue_greedily(target, prompts, new_tokens, report)
    labels = [teacher_labels(target, seq) for seq in sequences]
    heldout = max(1, len(sequences) // 8)
    draft = build_draft(target, layers)
    deadline = time.perf_counter() + max_seconds
    steps, loss = _fit(draft, sequences[heldout:], labels[heldout:], deadline, report)
    starts = [len(p) - 1 for p in prompts[:heldout]]  # score generated positions only
    agreement = _agreement(draft, sequences[:heldout], labels[:heldout], starts)
    result = DraftReport(
        str(target_path),
        layers,
        len(sequences),
        steps,
        time.perf_counter() - start,
        loss,
        agreement,
    )
    _save(draft.eval(), tokenizer, out_dir, result)
    return result


def _fit(
    draft: Any,
    sequences: list[list[int]],
    labels: list[torch.Tensor],
    deadline: float,
    report: Report,
) -> tuple[int, float]:
    params = [p for p in draft.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=3e-4, weight_decay=0.0)
    order = torch.randperm(len(sequences), generator=torch.Generator().manual_seed(0)).tolist()
    steps, loss_value = 0, float("nan")
    budget = max(1.0, deadline - time.perf_counter())
    started = time.perf_counter()
    while steps == 0 or time.perf_counter() < deadline:
        index = order[steps % len(order)]
        logits = draft(input_ids=torch.tensor([sequences[index]])).logits[0]
        loss = torch.nn.functional.cross_entropy(logits, labels[index])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        steps += 1
        loss_value = float(loss.detach())
        elapsed = min(int(time.perf_counter() - started), int(budget))  # the last step overruns
        report("train", elapsed, int(budget))
    return steps, loss_value


def _agreement(
    draft: Any, sequences: list[list[int]], labels: list[torch.Tensor], starts: list[int]
) -> float:
    """Share of positions from `starts` on (the continuation, not the chat template, whose
    fixed system prompt a tiny draft learns by heart) where the draft's argmax is the label."""
    agree = total = 0
    with torch.inference_mode():
        for seq, want, start in zip(sequences, labels, starts, strict=True):
            got = draft(input_ids=torch.tensor([seq])).logits[0].argmax(-1)
            agree += int((got[start:] == want[start:]).sum())
            total += len(seq) - start
    return agree / max(1, total)


def _deep_copy(view: Any) -> Any:
    """An independent model with the view's modules (the early-exit view shares weights)."""
    import copy

    return copy.deepcopy(view)


def _save(draft: Any, tokenizer: Any, out_dir: Path, result: DraftReport) -> None:
    tmp = out_dir.with_name(f"{out_dir.name}.tmp-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    draft.config.num_hidden_layers = result.layers
    draft.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / MARKER).write_text(json.dumps(asdict(result), indent=2) + "\n")
    if out_dir.exists():
        shutil.rmtree(out_dir)
    tmp.rename(out_dir)
