#!/usr/bin/env bash
# Train a set of paper experiments one after another (8 GPUs each):
#   scripts/train_paper.sh [PATTERN] [extra rpg-train flags ...]
# PATTERN is a shell glob over experiment names (default: '*-qwen3_4b-2k'); see
# `python configs/experiments.py list`. The released-code variants (`*_released-*`) run only when
# PATTERN names them (e.g. '*_released-qwen3_4b-2k'). Prepare the data once first:
#   rpg-prepare-data --output data/dapo_math_17k_en.jsonl --english-only --bad-escapes keep --conflicting-answers first
# (or --input /path/to/dapo_math_17k.parquet offline). Python, RPG_DATA, RPG_OUT as in run_config.sh:
# the activated environment's python (or $PYTHON), never a .venv found by itself.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PATTERN="${1:-*-qwen3_4b-2k}"; [[ $# -gt 0 ]] && shift
# shellcheck source=scripts/active_python.sh
source "$ROOT/scripts/active_python.sh"
PYTHON="$(active_python train_paper.sh)"
export PYTHON  # run_config.sh uses the same interpreter
mapfile -t NAMES < <("$PYTHON" "$ROOT/configs/experiments.py" list)
ran=0
for name in "${NAMES[@]}"; do
  # shellcheck disable=SC2053
  [[ "$name" == $PATTERN ]] || continue
  [[ "$name" != *_released-* || "$PATTERN" == *released* ]] || continue
  echo "[train_paper] === $name ===" >&2
  "$ROOT/scripts/run_config.sh" "$name" "$@"
  ran=$((ran + 1))
done
[[ $ran -gt 0 ]] || { echo "train_paper.sh: no experiment matches '$PATTERN'" >&2; exit 2; }
