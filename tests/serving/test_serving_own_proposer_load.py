"""The engine builds its own proposer when it loads: a depth past the model's layers (or a
draft that cannot load) fails the load, so a server never reports ready and then rejects
every request for its own setting."""

from __future__ import annotations

import pytest
import torch

from argosy.core.errors import ConfigError
from argosy.serving import ENGINES, EngineConfig


def test_a_self_depth_past_the_layers_fails_the_load() -> None:
    torch.set_num_threads(1)
    config = EngineConfig(model="smollm2-135m", speculative="self:999", num_threads=1)
    engine = ENGINES.get("transformers")(config)
    with pytest.raises(ConfigError, match="the depth must be 1 to"):
        engine.load()
