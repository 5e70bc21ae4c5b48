#!/usr/bin/env bash
# Installs the GPU stack (OpenRLHF 0.11.2 with vLLM 0.29.0, flash-attn 2.8.3, DeepSpeed 0.19.6) and this
# package into the environment you activated, in the one order that works:
#   1. torch==2.13.0, torchvision==0.28.0, torchaudio==2.11.0: vLLM 0.29.0 pins exactly these (another
#      torch would be replaced), and flash-attn's build needs torch installed first. Then the node's CUDA
#      prerequisites (rpg_openrlhf/nodecheck/prereqs.py): driver >= 580 for torch's CUDA 13,
#      torch.cuda.is_available(), nvcc of CUDA 13 (FusedAdam's JIT build, flash-attn's build); each
#      failure one line naming its fix (SKIP_PREREQS=1 goes on anyway, e.g. building an image without a GPU);
#   2. flash-attn==2.8.3 with --no-build-isolation (its setup.py imports torch: an isolated build fails with
#      "No module named 'torch'"), compiled for this node's GPU architecture only with MAX_JOBS sized from
#      its cores and memory (rpg_openrlhf/nodecheck/flash_build.py; 10-30 minutes at 32+ jobs, an estimate),
#      unless FLASH_ATTN_WHEEL names a prebuilt wheel (e.g. upstream's 2.8.3.post1 cu13 wheels);
#   3. OpenRLHF 0.11.2 with --no-deps, then its requirements and requirements/gpu.txt without their
#      flash-attn==2.8.3 pins plus flash-attn==<the installed version> (a post release survives: the pin
#      would replace it by the sdist), and the package, -e ".[dev]", constrained by requirements/constraints.txt.
# Usage: scripts/setup_gpu.sh [--system] [--dry-run]
#   The environment: the active venv or conda env (VIRTUAL_ENV / CONDA_PREFIX; `python` on PATH). With none
#   active it refuses, unless --system (the python on PATH as it is, e.g. inside a container).
#   `make setup-gpu` creates .venv-gpu and runs this inside it. --dry-run prints the commands only
#   (anywhere: without an active environment it says that a real run would refuse).
# Environment: FLASH_ATTN_WHEEL (a flash_attn-2.8.3[.postN] wheel for torch 2.13 + your CUDA + python: no build),
#   FLASH_ATTN_CUDA_ARCHS / MAX_JOBS / NVCC_THREADS (override the build's; default: this node's architecture,
#   min(cores / 2, available GiB / 9) jobs, 4 threads), SKIP_PREREQS=1 (step 1's checks warn only),
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
# the node's CUDA prerequisites (driver, torch.cuda, nvcc), one line each naming its fix
if ! run env PYTHONPATH="$ROOT" "$PY" -m rpg_openrlhf.nodecheck.prereqs; then
  if [[ -z "${SKIP_PREREQS:-}" ]]; then
    echo "setup_gpu.sh: error: the node's CUDA prerequisites are not met (lines above); fix them, or" \
      "SKIP_PREREQS=1 to install anyway" >&2
    exit 1
  fi
  echo "[setup_gpu] SKIP_PREREQS is set: going on although the prerequisites above are not met" >&2
fi

# 2. flash-attn against that torch: a prebuilt wheel, or a build for this node's architecture only
if [[ -n "${FLASH_ATTN_WHEEL:-}" ]]; then
  run "$PY" -m pip install --no-deps "$FLASH_ATTN_WHEEL"
else
  build_env=()
  if [[ $DRY -eq 0 ]]; then
    sized="$(PYTHONPATH="$ROOT" "$PY" -m rpg_openrlhf.nodecheck.flash_build env)" || {
      echo "setup_gpu.sh: error: cannot size flash-attn's build (line above); set FLASH_ATTN_CUDA_ARCHS and MAX_JOBS" >&2
      exit 1
    }
    mapfile -t build_env <<< "$sized"
  else
    echo "[setup_gpu] --dry-run: flash-attn builds with the output of python -m rpg_openrlhf.nodecheck.flash_build env" >&2
  fi
  run env "${build_env[@]}" "$PY" -m pip install --no-build-isolation flash-attn==2.8.3 || {
    echo "setup_gpu.sh: error: flash-attn 2.8.3 did not build: it needs nvcc of a CUDA toolkit matching torch's" \
      "CUDA (CUDA_HOME), or set FLASH_ATTN_WHEEL to a prebuilt wheel" >&2
    exit 1
  }
fi

# 3. OpenRLHF without its flash-attn==2.8.3 pin (which would replace a post release), then its requirements
#    and gpu.txt's with the installed flash-attn, and the package; pins agreeing with the CPU set
run "$PY" -m pip install --no-deps openrlhf==0.11.2
STEP3="${TMPDIR:-/tmp}/rpg-gpu-step3.txt"
[[ $DRY -eq 1 ]] || STEP3="$(mktemp "${TMPDIR:-/tmp}/rpg-gpu-step3.XXXXXX")"
run env PYTHONPATH="$ROOT" "$PY" -m rpg_openrlhf.nodecheck.flash_build step3 --out "$STEP3"
run "$PY" -m pip install -c "$ROOT/requirements/constraints.txt" -r "$STEP3" -e "$ROOT[dev]"
if [[ $DRY -eq 0 ]]; then
  "$PY" -c "import torch, flash_attn, vllm, deepspeed; from importlib.metadata import version; print('[setup_gpu] torch', torch.__version__,
'CUDA', torch.version.cuda, '| flash-attn', flash_attn.__version__, '| vllm', vllm.__version__,
'| deepspeed', deepspeed.__version__, '| openrlhf', version('openrlhf'))"
fi
echo "[setup_gpu] done; next, on the GPU node: make gpu-check" >&2
