"""`argosy train-draft`: a draft distilled from the served model's own outputs, written
atomically with its report, and served losslessly through `--speculative draft:PATH`."""

import json
import subprocess
import sys

import pytest

from argosy.serving import GenerationRequest, SamplingParams, models
from argosy.serving.draft_training import MARKER, train_draft

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def draft_path(tmp_path_factory):
    out = tmp_path_factory.mktemp("drafts") / "smol-draft"
    target = models.resolve("smollm2-135m", None)
    phases = []
    result = train_draft(
        target,
        out,
        layers=1,
        num_prompts=4,
        new_tokens=4,
        max_seconds=0.1,
        report=lambda phase, done, total: phases.append(phase),
    )
    assert result.steps >= 1 and 0.0 <= result.heldout_agreement <= 1.0
    assert {"generate", "train"} <= set(phases)
    return out


def test_the_draft_is_a_complete_checkpoint_with_its_report(draft_path):
    report = json.loads((draft_path / MARKER).read_text())
    assert report["layers"] == 1 and report["sequences"] == 4
    assert json.loads((draft_path / "config.json").read_text())["num_hidden_layers"] == 1
    assert not list(draft_path.parent.glob("*.tmp-*"))  # nothing half-written left behind


def test_serving_with_the_trained_draft_is_lossless(smol_engine, draft_path):
    for text in ("Name three fruits.", "Repeat: red, green, blue, red, green, blue."):
        ids = tuple(smol_engine.encode_chat([{"role": "user", "content": text}]))
        params = SamplingParams(max_tokens=12)
        want = smol_engine.generate(GenerationRequest(ids, params, "off"))
        got = smol_engine.generate(GenerationRequest(ids, params, f"draft:{draft_path}"))
        assert got.token_ids == want.token_ids
        assert got.spec.drafted > 0


def test_cli_rejects_an_unknown_model_with_exit_2():
    result = subprocess.run(
        [sys.executable, "-m", "argosy", "train-draft", "--model", "no-such-model"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2 and "smollm2-135m" in result.stderr
    assert "Traceback" not in result.stderr
