#!/usr/bin/env bash
# Builds the wheel kit the probe needs on a borrowed GPU machine that has torch, transformers and triton
# but no network (python -m rpg_openrlhf.nodecheck.probe; docs/training.md, "The probe"):
#   openrlhf==0.11.2 (--no-deps: its flash-attn, vLLM and Ray are not needed), deepspeed==0.19.6 as a pure
#   wheel (DS_BUILD_OPS=0, built in pip's isolated environment without torch: no compiled op; FusedAdam
#   JIT-builds on the node if nvcc is there), and the
#   small dependencies those import (einops, peft, ...; --no-deps each, so no torch or CUDA wheel comes in).
# Usage: scripts/gpu_probe_kit.sh [DIR]   (default .whl/probe-kit). Lists each wheel's size and the total,
#   and fails when the kit exceeds 64 MiB (what the GPU machines accept). On the GPU machine:
#   pip install --no-deps --no-index DIR/*.whl
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
KIT="${1:-$ROOT/.whl/probe-kit}"
PY="${PYTHON:-python3}"
LIMIT=$((64 * 1024 * 1024))
#: pure-Python dependencies OpenRLHF's models / DeepSpeed's runtime import at the probe's stages
SMALL=(einops peft hjson ninja py-cpuinfo msgpack pydantic pydantic-core annotated-types typing-inspection
       nvidia-ml-py jsonlines loralib optree accelerate)
mkdir -p "$KIT"
"$PY" -m pip download -q --no-deps -d "$KIT" openrlhf==0.11.2 "${SMALL[@]}"
if ! ls "$KIT"/deepspeed-0.19.6-*.whl >/dev/null 2>&1; then
  tmp="$(mktemp -d)"
  "$PY" -m pip download -q --no-deps --no-binary :all: -d "$tmp" deepspeed==0.19.6
  DS_BUILD_OPS=0 "$PY" -m pip wheel -q --no-deps -w "$KIT" "$tmp"/deepspeed-0.19.6.tar.gz
  rm -rf "$tmp"
fi
total=0
for wheel in "$KIT"/*.whl; do
  size=$(stat -c %s "$wheel"); total=$((total + size))
  printf '%10d  %s\n' "$size" "$(basename "$wheel")"
done
printf '%10d  total (%s MiB; limit 64 MiB)\n' "$total" "$((total / 1024 / 1024))"
if (( total > LIMIT )); then
  echo "gpu_probe_kit.sh: error: the kit is $total bytes, over 64 MiB: drop a wheel" >&2
  exit 1
fi
