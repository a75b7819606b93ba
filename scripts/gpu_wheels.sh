#!/usr/bin/env bash
# Fetch the wheels of scripts/gpu_wheels.txt (and the DLRover peer's) for a Python 3.12
# x86-64 GPU machine into ./.whl, and split the SmolLM2 GGUF into ./.gpu/parts (two parts
# that travel in two calls); scripts/gpu_check.sh installs and joins them there.
#   bash scripts/gpu_wheels.sh            # needs pip's index; run where the venv lives
set -eu
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 \
  manylinux1_x86_64; do platforms+=(--platform "$p"); done
grep -v '^#' scripts/gpu_wheels.txt | sed 's/#.*//' | xargs "$PY" -m pip download -q --no-deps \
  --only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}" -d .whl
gguf=$("$PY" - <<'PY'
from argosy.serving.models import CATALOG
print(CATALOG["smollm2-135m"].path())
PY
)
mkdir -p .gpu/parts
[ -e ".gpu/parts/$(basename "$gguf").sha256" ] || "$PY" scripts/gpu_parts.py split "$gguf" .gpu/parts 2
du -sh .whl .gpu/parts/*
