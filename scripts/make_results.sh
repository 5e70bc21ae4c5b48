#!/usr/bin/env bash
# Regenerates everything in results/ from its sources. Run from anywhere:
#   scripts/make_results.sh            (uses .venv/bin/python, or $PY)
# Parts: the paper's reported numbers and tables (results/paper/), the exact mechanism
# experiments (results/mechanisms/) and the CPU demo (results/demo/).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}

# --- the paper's tables (T3 8K, T5 4K, T6 2K, T8 Qwen2.5-7B-Instruct) -------------------
# results/paper/paper_tables.csv is the project's copy of the paper's numbers, normalised
# from the shared reference when it is present (it is committed, so a clone without the
# reference still rebuilds the tables from it).
PAPER_SRC=${PAPER_SRC:-../shared/reference/paper_tables.csv}
if [ -f "$PAPER_SRC" ]; then
  "$PY" -m rpg_eval.report.tables import-paper "$PAPER_SRC" --out results/paper/paper_tables.csv
fi
"$PY" -m rpg_eval.report.tables --paper results/paper/paper_tables.csv --out results/paper --formats md,tex,csv

# --- the paper's mechanisms, exactly, on an enumerable policy (a few minutes) -------------
"$PY" -m rpg_openrlhf.mechanisms.run --out results/mechanisms
# experiment 6: every framework's KL option run from its own code (TRL and verl from make setup)
"$PY" -m rpg_openrlhf.mechanisms.run conformance --out results/mechanisms

# --- the CPU demo: tiny model -> SFT -> RPG-REINFORCE-URKL and GRPO -> rpg-eval -> table/plots -----
"$PY" -m rpg_openrlhf.demo --out results/demo
