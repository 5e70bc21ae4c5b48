#!/usr/bin/env bash
# Run one paper experiment by name: scripts/run_config.sh NAME [extra rpg-train flags ...]
#   NAME: a file stem under configs/experiments/ (python configs/experiments.py list) or a yaml path.
#   Python: the environment you activated (`python` on PATH; PYTHON=/path/to/python overrides),
#   never a .venv it happens to find: the CPU venv of `make setup` would turn a GPU run into a CPU one.
#   Environment: RPG_DATA (prompt jsonl, default data/dapo_math_17k_en.jsonl; make it with
#   `rpg-prepare-data --input /path/or/hub-id --output data/dapo_math_17k_en.jsonl --english-only --bad-escapes keep --conflicting-answers first`),
#   RPG_OUT (run directory root, default runs). The config's env (e.g. RPG_REWARD_GRADER=paper) is
#   exported unless already set; it may name only the RPG_* variables rpg-train reads (ENV_NAMES below:
#   PYTHONPATH, LD_PRELOAD, PATH ... would change what runs). Extra flags are appended, so they override
#   the config (e.g. --dry-run).
set -euo pipefail
if [[ $# -lt 1 || "$1" == -* ]]; then
  sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/active_python.sh
source "$ROOT/scripts/active_python.sh"
PYTHON="$(active_python run_config.sh)"
NAME="$1"; shift
EXP="$ROOT/configs/experiments.py"
# Captured first (not read from a process substitution): a config error is the script's one line, exit 2.
FLAGS="$("$PYTHON" "$EXP" argv "$NAME" 2>&1)" || { echo "run_config.sh: $FLAGS" >&2; exit 2; }
mapfile -t ARGV <<< "$FLAGS"
[[ -n "$FLAGS" ]] || { echo "run_config.sh: no flags for $NAME" >&2; exit 2; }
ENVS="$("$PYTHON" "$EXP" env "$NAME" 2>&1)" || { echo "run_config.sh: $ENVS" >&2; exit 2; }
#: The variables a config's env: may set: those rpg-train and its workers read (docs/training.md).
ENV_NAMES=" RPG_REWARD_GRADER RPG_CAPTURE_DIR RPG_CPU_ROLLOUT RPG_CPU_ROLLOUT_DTYPE RPG_CPU_TRUST_REMOTE_CODE \
RPG_RAY_DASHBOARD RPG_ALLOW_UNCHECKED_VERSIONS RPG_SYNC_CHECK_DIR RPG_SYNC_CHECK_LENGTHS RPG_DEBUG "
EXPORTS=()
while IFS= read -r line; do  # all checked before any is exported
  [[ -n "$line" ]] || continue
  key="${line%%=*}"
  if [[ "$ENV_NAMES" != *" $key "* ]]; then
    echo "run_config.sh: $NAME: env: $key is not a variable rpg-train reads; a config may set only:$ENV_NAMES" >&2
    exit 2
  fi
  [[ -n "${!key:-}" ]] || EXPORTS+=("$line")
done <<< "$ENVS"
for line in "${EXPORTS[@]}"; do export "$line"; done
echo "[run_config] $NAME ($PYTHON): rpg-train ${ARGV[*]} $*" >&2
exec "$PYTHON" -m rpg_openrlhf.launch.cli "${ARGV[@]}" "$@"
