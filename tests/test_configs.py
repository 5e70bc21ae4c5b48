"""configs/: one config per paper experiment; each config's GPU argument set (as scripts/run_config.sh
runs it: no --backend, so auto) passes rpg-train --dry-run through OpenRLHF's real parser (in-process)
on any machine, planned for the gpu backend; without CUDA a real run refuses instead of falling back
to CPU; the launchers use the activated environment; the checked-in files match the generator; a
file that is not a config is one line; --backend's choice (rpg_openrlhf/launch/backend.py) in-process."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from rpg_openrlhf.launch import backend

REPO = Path(__file__).resolve().parents[1]


def _experiments_module():
    spec = importlib.util.spec_from_file_location(
        "rpg_configs_experiments", REPO / "configs" / "experiments.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


EXP = _experiments_module()
NAMES = sorted(EXP.all_experiments())


def test_matrix_covers_the_paper(shared_data):
    import csv

    assert len(NAMES) == len(EXP.METHODS) * len(EXP.SETTINGS) == 88
    reported = set()
    with open(shared_data.parent / "reference" / "paper_tables.csv", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            reported.add((row["table"], row["method"]))
    for variant in ("paper_text", "released_code"):
        ours = {
            (c["paper"]["table"], c["paper"]["method"])
            for c in EXP.all_experiments().values()
            if c["variant"] == variant
        }
        # the released code cannot express REINFORCE++ (docs/losses.md, "The released code")
        missing = {
            r for r in reported - ours if variant == "paper_text" or not r[1].startswith("REINFORCE++")
        }
        assert not missing, (variant, missing)


def test_files_match_generator(tmp_path):
    generated = {p.name: p.read_text() for p in EXP.generate(tmp_path)}
    on_disk = {p.name: p.read_text() for p in (REPO / "configs" / "experiments").glob("*.yaml")}
    assert generated == on_disk, "run: python configs/experiments.py generate"


@pytest.fixture
def hub_online(monkeypatch):
    """The configs name hub models; a dry run downloads nothing but refuses hub ids that could not
    load (offline mode and not cached), so these dry runs run as on a machine that may download."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)


def _dry_run(argv: list[str], capsys) -> dict:
    from rpg_openrlhf.launch.cli import main

    main([*argv, "--dry-run"])
    out = capsys.readouterr().out
    return json.loads(out[out.index("{") :])


@pytest.mark.parametrize("name", NAMES)
def test_config_passes_dry_run(name, capsys, hub_online):
    from rpg_openrlhf.launch.backend import gpu_shape

    config = EXP.load(name)
    argv = EXP.to_argv(config, data="/data/dapo.jsonl", out="/runs")  # what run_config.sh passes
    resolved = _dry_run(argv, capsys)
    rpg, orl = resolved["rpg"], resolved["openrlhf"]
    # every paper config describes a GPU shape: planned on the gpu backend here too, GPU settings kept
    assert gpu_shape(SimpleNamespace(**config["flags"]))
    assert resolved["backend"] == "gpu", resolved["backend"]
    plan = resolved["memory_plan"]  # enforced on the gpu backend: 80 GiB without CUDA, else the GPU's
    assert (
        plan["enforced"]
        and plan["fits"]
        and all(p["total_gib"] <= plan["gpu_memory_gib"] for p in plan["phases"].values())
    )
    assert (
        orl["ds"]["attn_implementation"] == config["flags"]["ds.attn_implementation"] == "flash_attention_2"
    )
    assert orl["vllm"]["enable_sleep"] is True and orl["vllm"]["num_engines"] == 8
    flags = config["flags"]
    assert orl["data"]["prompt_dataset"] == "/data/dapo.jsonl"
    assert orl["ckpt"]["path"] == f"/runs/{name}/ckpt"
    assert orl["rollout"]["n_samples_per_prompt"] == 16 and orl["train"]["batch_size"] == 512
    assert orl["actor"]["adam"]["lr"] == flags["actor.adam.lr"]
    # 400 rollout steps, as the paper's runs, whatever dynamic sampling refills; the warm-up is
    # 10 rollout steps of the 400-step schedule: 16 optimizer steps per rollout (512 x 16 / 512).
    assert orl["rpg"]["max_steps"] == 400 and orl["algo"]["dynamic_filtering_enable"] is True
    assert math.ceil(400 * 16 * orl["actor"]["lr_warmup_ratio"]) == 10 * 16
    assert (
        orl["train"]["num_episodes"] * (14_020 // 512) * 0.15 >= 400
    )  # data for 400 steps at a 15% pass rate
    if "rpg.loss" in flags:
        cfg = rpg["loss_config"]
        assert rpg["enabled"] and rpg["loss"] == flags["rpg.loss"] and rpg["style"] == flags["rpg.style"]
        # the released code applies dual-clip c = 10 to every PPO reward term (issue #11, item 9)
        assert cfg["clip_c"] == 10.0
        released = config["variant"] == "released_code"
        assert cfg["aggregation_scope"] == ("micro_batch" if released else "step")
        assert cfg["kl_rho"] is not released and cfg["weight_level"] == "token"
        if not released:
            assert cfg["beta"] == 1e-4 and rpg["reference_model"] is False and cfg["kl_value_clamp"] is None
            assert cfg["eps_low"] == 0.2 and cfg["eps_high"] == 0.28
            reinforce = flags["rpg.style"] == "reinforce_clip"
            assert flags["actor.adam.lr"] == (5e-7 if reinforce else 1e-6)
        else:  # the released scripts: the differentiable loop, the KL (if any) clamped at 10
            assert rpg["style"] == "differentiable"
            assert cfg["kl_value_clamp"] == (10.0 if cfg["beta"] > 0 else None)
            if name.startswith("rpg_reinforce_"):  # use_kl_loss False, in-reward KL 0: no KL
                assert cfg["beta"] == 0.0 and flags["actor.adam.lr"] == 5e-7
    else:
        assert rpg == {"enabled": False}
        assert orl["algo"]["advantage"]["estimator"] == flags["algo.advantage.estimator"]
        assert orl["actor"]["dual_clip"] == 10.0


def _run_config(
    tmp_path: Path, path: str, *args: str, script: str = "run_config.sh"
) -> subprocess.CompletedProcess:
    """A launcher script with PATH = ``path`` and no PYTHON: what the user's activated shell gives it."""
    env = {
        k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "PYTHON")
    }
    env.update({"RPG_DATA": "/d.jsonl", "RPG_OUT": str(tmp_path), "PATH": path})
    return subprocess.run([str(REPO / "scripts" / script), *args], capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=300)  # fmt: skip


def _activated(tmp_path: Path) -> str:
    """A PATH whose first ``python`` runs this test's interpreter (an activated environment), under
    another name than the repository's .venv/bin/python, so the launcher's choice shows."""
    bin_dir = tmp_path / "activated" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (bin_dir / "python").chmod(0o755)
    return f"{bin_dir}:/usr/bin:/bin"


def test_run_config_script_dry_run(tmp_path):
    """scripts/run_config.sh NAME --backend cpu --dry-run (one subprocess; each config's own argv runs
    in-process above, on the gpu backend): the activated environment's python, not the repository's
    .venv; RPG_DATA; the extra flags appended after the config's, so they override it."""
    proc = _run_config(tmp_path, _activated(tmp_path), "rpg_reinforce_urkl-qwen3_4b-8k", "--backend", "cpu",
                       "--dry-run")  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"({tmp_path / 'activated' / 'bin' / 'python'})" in proc.stderr  # not .venv/bin/python
    resolved = json.loads(proc.stdout[proc.stdout.index("{") :])
    assert resolved["backend"] == "cpu" and resolved["rpg"]["loss"] == "urkl"
    assert resolved["openrlhf"]["data"]["prompt_dataset"] == "/d.jsonl"


@pytest.mark.parametrize("script", ["run_config.sh", "train_paper.sh"])
def test_launchers_refuse_an_environment_without_the_package(tmp_path, script):
    """No activated environment (PATH's python lacks rpg-openrlhf): one line, exit 2, even though the
    repository holds a .venv that has it."""
    proc = _run_config(
        tmp_path, "/usr/bin:/bin", "rpg_reinforce_urkl-qwen3_4b-8k", "--dry-run", script=script
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and f"{script}: error:" in proc.stderr
    assert "has no rpg-openrlhf with torch installed: activate the environment" in proc.stderr


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="refusal without CUDA")
def test_gpu_config_refuses_without_cuda(capsys, hub_online, monkeypatch, tmp_path):
    """Not a dry run, no CUDA: one line naming the torch build, before Ray (no silent CPU fallback)."""
    import ray
    import torch

    from rpg_openrlhf.launch.cli import main

    monkeypatch.setattr(ray, "init", lambda *a, **k: pytest.fail("ray.init: the refusal came too late"))
    data = tmp_path / "d.jsonl"  # there: a missing dataset is refused first (tests/test_io_careless.py)
    data.write_text("{}\n")
    argv = EXP.to_argv(EXP.load("rpg_reinforce_urkl-qwen3_4b-8k"), data=str(data), out=str(Path("/runs")))
    with pytest.raises(SystemExit) as exc:
        main(argv)  # --backend auto: the config's GPU shape makes it a gpu run
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1, err
    assert (
        err[0].startswith("rpg-train: error: --backend ") and f"torch {torch.__version__}: no CUDA" in err[0]
    )
    assert "a GPU shape: --actor.num_nodes 1 x --actor.num_gpus_per_node 8 = 8 GPUs > 4" in err[0]


# ----------------------------------------------------------------------------- a config that is not one
@pytest.mark.parametrize(
    ("text", "message"),
    [("[1, 2]\n", "got a list"), ("name: x\nflags: {data.prompt_dataset: '{dta}'}\n", "unknown or malformed placeholder ('dta')")],
)  # fmt: skip
def test_a_bad_config_is_one_line(tmp_path: Path, text: str, message: str) -> None:
    """Issue 31: one line ``run_config.sh: ...``, exit 2 (no traceback, no second line)."""
    config = tmp_path / "c.yaml"
    config.write_text(text)
    proc = _run_config(tmp_path, _activated(tmp_path), str(config))
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("run_config.sh: ") and message in lines[0], lines


def test_an_unknown_name_gives_the_closest(tmp_path: Path) -> None:
    proc = _run_config(tmp_path, _activated(tmp_path), "rpg_urkl-qwen3_4b-8kk")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "closest: rpg_urkl-qwen3_4b-8k," in lines[0] and len(lines[0]) < 300, lines


def test_a_config_env_sets_only_the_projects_variables(tmp_path: Path) -> None:
    """Issue 38, item 12: a config's env: once exported everything (PYTHONPATH ran a sitecustomize.py);
    now only the RPG_* variables rpg-train reads, anything else named in one line before anything runs."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("open(__file__ + '.ran', 'w')\n")
    config = tmp_path / "c.yaml"
    config.write_text(f"name: c\nenv: {{PYTHONPATH: {site}}}\nflags: {{rpg.loss: urkl}}\n")
    proc = _run_config(tmp_path, _activated(tmp_path), str(config), "--dry-run")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith(
        f"run_config.sh: {config}: env: PYTHONPATH is not a variable rpg-train reads"
    ), lines
    assert not (site / "sitecustomize.py.ran").exists()


# ----------------------------------------------------------------------------- --backend's choice, in-process
def shape(**flags: int) -> str | None:
    return backend.gpu_shape(SimpleNamespace(**{k.replace("__", "."): v for k, v in flags.items()}))


def test_gpu_shape_boundary() -> None:
    assert shape(actor__num_nodes=1, actor__num_gpus_per_node=4, vllm__num_engines=4) is None
    assert "= 5 GPUs > 4" in shape(actor__num_nodes=1, actor__num_gpus_per_node=5)
    assert "= 8 GPUs > 4" in shape(actor__num_nodes=2, actor__num_gpus_per_node=4)
    engines = shape(
        actor__num_nodes=1, actor__num_gpus_per_node=1, vllm__num_engines=3, vllm__tensor_parallel_size=2
    )
    assert engines.startswith("--vllm.num_engines 3 x --vllm.tensor_parallel_size 2 = 6 GPUs")
    assert shape(actor__num_nodes=1, actor__num_gpus_per_node=1, vllm__num_engines=None) is None  # unset: 0


@pytest.fixture
def cuda(monkeypatch):
    def set_cuda(available: bool) -> None:
        monkeypatch.setattr(backend, "_cuda_available", lambda: available)

    return set_cuda


GPU_SHAPE = "--actor.num_nodes 1 x --actor.num_gpus_per_node 8 = 8 GPUs > 4"


def test_with_cuda_auto_and_gpu_take_the_gpu(cuda) -> None:
    cuda(True)
    assert backend.resolve_backend("auto")[0] == backend.resolve_backend("gpu", shape=GPU_SHAPE)[0] == "gpu"
    assert backend.resolve_backend("cpu", shape=GPU_SHAPE)[0] == "cpu"  # asked for explicitly


def test_without_cuda(cuda) -> None:
    cuda(False)
    build = f"torch {torch.__version__}: no CUDA" if not torch.version.cuda else "no GPU visible"
    assert backend.resolve_backend("auto")[0] == "cpu"  # a CPU-sized run: the CPU backend
    assert backend.resolve_backend("cpu", shape=GPU_SHAPE)[0] == "cpu"
    for requested, shape_ in (("auto", GPU_SHAPE), ("gpu", None)):
        with pytest.raises(ValueError, match=f"--backend {requested}") as exc:
            backend.resolve_backend(requested, shape=shape_)
        assert build in str(exc.value) and "\n" not in str(exc.value)
        chosen, reason = backend.resolve_backend(requested, shape=shape_, dry_run=True)
        assert chosen == "gpu" and "a plan only" in reason and build in reason
    with pytest.raises(ValueError, match="--backend: 'tpu'"):
        backend.resolve_backend("tpu")


def test_torch_build_of_a_cuda_build_without_a_gpu(monkeypatch) -> None:
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert (
        backend.torch_build()
        == f"torch {torch.__version__} (CUDA 13.0): no GPU visible (CUDA_VISIBLE_DEVICES='')"
    )
    monkeypatch.setattr(torch.version, "cuda", None)
    assert backend.torch_build() == f"torch {torch.__version__}: no CUDA"
