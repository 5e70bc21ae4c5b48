#!/usr/bin/env bash
# Builds the wheel kit the probe needs on a borrowed GPU machine that has torch, transformers and triton
# but no network (python -m rpg_openrlhf.nodecheck.probe; docs/training.md, "The probe"):
#   openrlhf==0.11.2 (--no-deps: its flash-attn, vLLM and Ray are not needed), deepspeed==0.19.6 as a pure
#   wheel (DS_BUILD_OPS=0, built in pip's isolated environment without torch: no compiled op; FusedAdam
#   JIT-builds on the node if nvcc is there), and the
#   small dependencies those import (einops, peft, ...; --no-deps each, so no torch or CUDA wheel comes in).
# Usage: scripts/gpu_probe_kit.sh [--python X.Y] [DIR]   (default .whl/probe-kit)
#   --python: the CPython of the GPU machine the wheels are for (default 3.12, the lent machines' python3:
#   /work/.library/device/KINDS.md); compiled wheels (pydantic-core, msgpack, optree, ...) are downloaded
#   for it, whatever Python runs this script. DIR must be new, empty or made by this script (its
#   .rpg-owner); the wheels an earlier run put there (listed in DIR/.kit-wheels) are replaced, except
#   DeepSpeed's pure wheel (reused); nothing else in DIR is touched.
#   Lists each wheel's size and the total, and fails when the kit exceeds 64 MiB (what the GPU machines
#   accept). On the GPU machine: pip install --no-deps --no-index DIR/*.whl
set -euo pipefail
shopt -s nullglob
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TARGET=3.12
if [[ "${1:-}" == "--python" ]]; then
  TARGET="${2:-}"; shift 2 || true
fi
if [[ ! "$TARGET" =~ ^3\.[0-9]+$ ]]; then
  echo "gpu_probe_kit.sh: error: --python takes the GPU machine's CPython as 3.N (e.g. 3.12), got '$TARGET'" >&2
  exit 2
fi
DEFAULT_KIT="$ROOT/.whl/probe-kit"
KIT="${1:-$DEFAULT_KIT}"
PY="${PYTHON:-python3}"
LIMIT=$((64 * 1024 * 1024))
TAG="cp${TARGET/./}"
#: pure-Python dependencies OpenRLHF's models / DeepSpeed's runtime import at the probe's stages
SMALL=(einops peft hjson ninja py-cpuinfo msgpack pydantic pydantic-core annotated-types typing-inspection
       nvidia-ml-py jsonlines loralib optree accelerate)
#: the manylinux platforms pip matches exactly (the device README's list, plus older and newer glibc tags)
PLATFORMS=()
for p in manylinux_2_39 manylinux_2_35 manylinux_2_34 manylinux_2_31 manylinux_2_28 manylinux_2_27 manylinux_2_24 \
         manylinux_2_17 manylinux2014 manylinux_2_12 manylinux2010 manylinux_2_5 manylinux1; do
  PLATFORMS+=(--platform "${p}_x86_64")
done
if [[ -e "$KIT" && ! -d "$KIT" ]]; then
  echo "gpu_probe_kit.sh: error: $KIT: is not a folder; give a new or empty folder" >&2
  exit 2
fi
if [[ -d "$KIT" && ! -f "$KIT/.rpg-owner" && "$KIT" != "$DEFAULT_KIT" && -n "$(ls -A "$KIT")" ]]; then
  echo "gpu_probe_kit.sh: error: $KIT: holds files and no .rpg-owner, so this script did not make it; nothing was changed: give a new or empty folder" >&2
  exit 2
fi
mkdir -p "$KIT"
[[ -f "$KIT/.rpg-owner" ]] || echo "gpu_probe_kit.sh" > "$KIT/.rpg-owner"
NEW="$(mktemp -d "$KIT/.new.XXXXXX")"
trap 'rm -rf "$NEW"' EXIT
DS="deepspeed-0.19.6-py3-none-any.whl"
if [[ -e "$KIT/$DS" ]]; then cp "$KIT/$DS" "$NEW/"; fi  # a pure wheel: any Python
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$TARGET" --implementation cp \
  "${PLATFORMS[@]}" -d "$NEW" openrlhf==0.11.2 "${SMALL[@]}"
if [[ ! -e "$NEW/$DS" ]]; then
  tmp="$(mktemp -d)"
  "$PY" -m pip download -q --no-deps --no-binary :all: -d "$tmp" deepspeed==0.19.6
  DS_BUILD_OPS=0 "$PY" -m pip wheel -q --no-deps -w "$NEW" "$tmp"/deepspeed-0.19.6.tar.gz
  rm -rf "$tmp"
fi
for wheel in "$NEW"/*.whl; do  # a wheel compiled for another CPython would be refused on the node
  name="$(basename "$wheel")"
  if [[ "$name" =~ -cp3[0-9]+- && ! "$name" =~ -$TAG- ]]; then
    echo "gpu_probe_kit.sh: error: $name is built for another CPython than $TARGET; nothing was changed in $KIT" >&2
    exit 1
  fi
done
if [[ -f "$KIT/.kit-wheels" ]]; then  # the wheels an earlier run put here, and only those
  while IFS= read -r name; do
    if [[ "$name" == *.whl && "$name" != */* ]]; then rm -f "$KIT/$name"; fi
  done < "$KIT/.kit-wheels"
elif [[ "$KIT" == "$DEFAULT_KIT" ]]; then
  rm -f "$KIT"/*.whl  # a kit of an older version of this script, in its own default folder
fi
names=()
for wheel in "$NEW"/*.whl; do names+=("$(basename "$wheel")"); mv "$wheel" "$KIT/"; done
printf '%s\n' "${names[@]}" > "$KIT/.kit-wheels"
total=0
for name in "${names[@]}"; do wheel="$KIT/$name"
  size=$(stat -c %s "$wheel"); total=$((total + size))
  printf '%10d  %s\n' "$size" "$(basename "$wheel")"
done
printf '%10d  total (%s MiB; limit 64 MiB) for CPython %s\n' "$total" "$((total / 1024 / 1024))" "$TARGET"
if (( total > LIMIT )); then
  echo "gpu_probe_kit.sh: error: the kit is $total bytes, over 64 MiB: drop a wheel" >&2
  exit 1
fi
