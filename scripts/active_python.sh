#!/usr/bin/env bash
# Sourced by the launchers (run_config.sh, train_paper.sh): `active_python NAME` prints the Python of
# the environment the user activated ($PYTHON if set, else `python` / `python3` on PATH), and stops
# with one line when rpg-openrlhf and torch are not installed there (-I: the installed distribution,
# not a package that the current directory happens to hold). It never looks for a .venv by itself:
# on a GPU node where `make setup` once ran, .venv holds the CPU torch.
set -euo pipefail

active_python() {
  local who="$1" py="${PYTHON:-}"
  if [[ -z "$py" ]]; then
    py="$(command -v python || command -v python3 || true)"
  fi
  if [[ -z "$py" ]] || ! "$py" -I -c "import importlib.metadata as m, torch; m.version('rpg-openrlhf')" 2>/dev/null; then
    echo "$who: error: ${py:-no python on PATH} has no rpg-openrlhf with torch installed: activate the environment" \
      "you installed it into (e.g. source .venv-gpu/bin/activate after make setup-gpu) or set PYTHON" >&2
    exit 2
  fi
  echo "$py"
}
