#!/usr/bin/env bash
# A small RPG run on CPU (minutes): a tiny random Qwen2-shaped model, 4 arithmetic prompts,
# RPG-REINFORCE-URKL with RPG-Style Clip and pi_ref = pi_old, 2 global steps, HF checkpoints.
#   scripts/train_tiny_cpu.sh [OUT_DIR] [extra rpg-train flags ...]   (default: a fresh folder, printed)
# It shows the wiring, not learning: the reward is "the response contains a digit".
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ $# -gt 0 ]]; then OUT="$1"; shift; else
  OUT="$(mktemp -d "${TMPDIR:-/tmp}/rpg_tiny.XXXXXX")"  # one run's own folder, not one shared by every user
  echo "train_tiny_cpu.sh: writing into $OUT" >&2
fi
PYTHON="${PYTHON:-$([[ -x "$ROOT/.venv/bin/python" ]] && echo "$ROOT/.venv/bin/python" || echo python3)}"
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$ROOT/.venv/torch_extensions}"
export DS_ACCELERATOR=cpu HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 RAY_USAGE_STATS_ENABLED=0
mkdir -p "$OUT"
# head size 32 (hidden 64, 2 heads): vLLM's CPU attention serves it (not the default 16)
"$PYTHON" -c "from rpg_openrlhf.tinymodel import build_tiny_model; build_tiny_model('$OUT/model', heads=2, kv_heads=1)"
printf '%s\n' '{"input": "1+2=", "label": "3"}' '{"input": "4+4=", "label": "8"}' \
  '{"input": "2+5=", "label": "7"}' '{"input": "9+0=", "label": "9"}' > "$OUT/prompts.jsonl"
cd "$ROOT"
exec "$PYTHON" -m rpg_openrlhf.launch.cli --backend cpu \
  --actor.model_name_or_path "$OUT/model" \
  --reward.remote_url "$ROOT/tests/helpers/reward_has_digit.py" \
  --data.prompt_dataset "$OUT/prompts.jsonl" --data.input_key input --data.label_key label \
  --rpg.loss urkl --rpg.style reinforce_clip --rpg.ref_update rollout --rpg.beta 0.01 \
  --actor.eps_clip_low_high 0.2 0.28 \
  --rollout.n_samples_per_prompt 4 --rollout.batch_size 2 --train.batch_size 4 \
  --rollout.micro_batch_size 2 --train.micro_batch_size 2 \
  --actor.num_nodes 1 --actor.num_gpus_per_node 1 --ref.num_gpus_per_node 1 \
  --rollout.max_new_tokens 8 --data.max_len 32 --ds.zero_stage 0 --vllm.num_engines 1 \
  --ckpt.save_hf --ckpt.save_steps 1 --ckpt.path "$OUT/ckpt" --ckpt.output_dir "$OUT/final" \
  --train.num_episodes 1 --actor.adam.lr 1e-3 --actor.lr_scheduler constant "$@"
