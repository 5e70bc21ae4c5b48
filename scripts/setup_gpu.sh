#!/usr/bin/env bash
# Installs the GPU stack (OpenRLHF 0.11.2 with vLLM 0.29.0, flash-attn 2.8.3, DeepSpeed 0.19.6) and this
# package into the environment you activated, in the one order that works:
#   1. torch==2.13.0, torchvision==0.28.0, torchaudio==2.11.0: vLLM 0.29.0 pins exactly these (another
#      torch would be replaced), and flash-attn's build needs torch installed first;
#   2. flash-attn==2.8.3 with --no-build-isolation (its setup.py imports torch: an isolated build fails with
#      "No module named 'torch'"); it compiles with nvcc unless FLASH_ATTN_WHEEL names a prebuilt wheel;
#   3. requirements/gpu.txt and the package, -e ".[gpu,dev]", constrained by requirements/constraints.txt.
# Usage: scripts/setup_gpu.sh [--system] [--dry-run]
#   The environment: the active venv or conda env (VIRTUAL_ENV / CONDA_PREFIX; `python` on PATH). With none
#   active it refuses, unless --system (the python on PATH as it is, e.g. inside a container).
#   `make setup-gpu` creates .venv-gpu and runs this inside it. --dry-run prints the commands only
#   (anywhere: without an active environment it says that a real run would refuse).
# Environment: FLASH_ATTN_WHEEL (a flash_attn-2.8.3 wheel for torch 2.13 + your CUDA + python: no build),
#   MAX_JOBS (parallel compile jobs of the flash-attn build, default 4; each needs several GB of RAM),
#   TORCH_INDEX_URL (an index for step 1; default PyPI, whose torch 2.13.0 is the CUDA build vLLM's wheel uses).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SYSTEM=0; DRY=0
for arg in "$@"; do
  case "$arg" in
    --system) SYSTEM=1 ;;
    --dry-run) DRY=1 ;;
    *) echo "setup_gpu.sh: error: unknown argument $arg (usage: scripts/setup_gpu.sh [--system] [--dry-run])" >&2; exit 2 ;;
  esac
done
PY="$(command -v python || command -v python3 || echo python)"
if [[ -z "${VIRTUAL_ENV:-}${CONDA_PREFIX:-}" && $SYSTEM -eq 0 ]]; then
  message="no virtual environment is active; activate one (or run make setup-gpu, which creates .venv-gpu),"
  message+=" or pass --system to install into $PY as it is"
  if [[ $DRY -eq 0 ]]; then echo "setup_gpu.sh: error: $message" >&2; exit 2; fi
  echo "[setup_gpu] --dry-run: $message (a real run would stop here)" >&2
fi
run() { echo "+ $*" >&2; [[ $DRY -eq 1 ]] || "$@"; }
echo "[setup_gpu] installing into $PY" >&2

# 1. torch as vLLM 0.29.0 pins it (plus what flash-attn's build imports, since its build is not isolated)
run "$PY" -m pip install --upgrade pip setuptools wheel packaging ninja psutil
run "$PY" -m pip install ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} \
  torch==2.13.0 torchvision==0.28.0 torchaudio==2.11.0
if [[ $DRY -eq 0 ]] && ! "$PY" -c "import torch, sys; sys.exit(0 if torch.version.cuda else 1)"; then
  echo "setup_gpu.sh: error: step 1 installed $("$PY" -c 'import torch; print("torch", torch.__version__)'):" \
    "no CUDA (a CPU wheel; check pip's index/find-links, or set TORCH_INDEX_URL)" >&2
  exit 1
fi

# 2. flash-attn against that torch
if [[ -n "${FLASH_ATTN_WHEEL:-}" ]]; then
  run "$PY" -m pip install --no-deps "$FLASH_ATTN_WHEEL"
else
  MAX_JOBS="${MAX_JOBS:-4}" run "$PY" -m pip install --no-build-isolation flash-attn==2.8.3 || {
    echo "setup_gpu.sh: error: flash-attn 2.8.3 did not build: it needs nvcc of a CUDA toolkit matching torch's" \
      "CUDA (CUDA_HOME), or set FLASH_ATTN_WHEEL to a prebuilt wheel" >&2
    exit 1
  }
fi

# 3. the package with OpenRLHF[vllm], pins agreeing with the CPU set
run "$PY" -m pip install -c "$ROOT/requirements/constraints.txt" -r "$ROOT/requirements/gpu.txt" \
  -e "$ROOT[gpu,dev]"
if [[ $DRY -eq 0 ]]; then
  "$PY" -c "import torch, flash_attn, vllm, deepspeed; from importlib.metadata import version; print('[setup_gpu] torch', torch.__version__,
'CUDA', torch.version.cuda, '| flash-attn', flash_attn.__version__, '| vllm', vllm.__version__,
'| deepspeed', deepspeed.__version__, '| openrlhf', version('openrlhf'))"
fi
echo "[setup_gpu] done; next, on the GPU node: make gpu-check" >&2
