"""``rpg-train`` on a Ray cluster started beforehand, as the paper's runs are (issue #11 items 3-5).

The module starts its own Ray head on localhost (``ray start --head`` with its own temp dir and free
ports, logical GPUs, and a plain environment: no ``RPG_*`` variable, no DeepSpeed settings) and stops
exactly that one at the end (the processes whose command line names its temp dir, and their
children; never ``ray stop``, which would stop every Ray on the machine). Against it:

* ``--rpg.backend auto`` decides from the cluster (logical GPUs, no CUDA -> cpu) and ``gpu`` is
  accepted from this GPU-less driver because the cluster offers GPUs;
* a plain ``ray.init()`` would join that cluster through the address file, the CPU backend starts
  its own local Ray instead;
* a stock GRPO run joins it with ``RAY_ADDRESS``, its rollout workers grade with the paper's grader
  (``RPG_REWARD_GRADER=paper`` set only in the driver: rewards -1, not math-verify's 0), and
  ``--rpg.max_steps 2`` stops it after global step 2 of 6 with a checkpoint there although
  ``--ckpt.save_steps`` is 5; resumed with ``--rpg.max_steps 3`` it trains exactly step 3.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import budgets
import pytest
from pipeline_run import run_pipeline
from run_log import explain

REPO = Path(__file__).resolve().parents[1]
PROMPTS = [("1+2=", "3"), ("4+4=", "8"), ("2+5=", "7"), ("9+0=", "9")]
RUN_TIMEOUT = budgets.START_S


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _stop_processes_naming(marker: str) -> None:
    """Terminate (then kill) the processes whose command line contains ``marker``, and their children."""
    import psutil

    found = {}
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if any(marker in arg for arg in proc.info["cmdline"] or []):
                found[proc.pid] = proc
                for child in proc.children(recursive=True):
                    found[child.pid] = child
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    procs = [p for pid, p in found.items() if pid != os.getpid()]
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.terminate()
    _, alive = psutil.wait_procs(procs, timeout=20)
    for proc in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    psutil.wait_procs(alive, timeout=10)


def _plain_env() -> dict[str, str]:
    """The environment of a cluster started by someone else: nothing of this project's."""
    env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG", "USER") if k in os.environ}
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    env["RAY_worker_niceness"] = "0"  # a CPU cluster as docs/training.md starts one: workers un-niced
    return env


@pytest.fixture(scope="module")
def ray_head():
    """A Ray head on localhost: 2 logical GPUs, 8 logical CPUs; stopped (only it) afterwards."""
    root = tempfile.mkdtemp(prefix="rpgc", dir="/tmp")  # short: Ray's socket paths must stay < 108 chars
    temp_dir = os.path.join(root, "ray")  # RAY_TMPDIR=root makes it the default cluster of a plain ray.init()
    port, *others = _free_ports(9)
    ray_bin = str(Path(sys.executable).parent / "ray")
    cmd = [
        ray_bin, "start", "--head", "--node-ip-address", "127.0.0.1", "--port", str(port), "--temp-dir", temp_dir,
        "--num-cpus", "8", "--num-gpus", "2", "--include-dashboard=false", "--disable-usage-stats",
        "--node-manager-port", str(others[0]), "--object-manager-port", str(others[1]),
        "--ray-client-server-port", str(others[2]), "--dashboard-agent-listen-port", str(others[3]),
        "--dashboard-agent-grpc-port", str(others[4]), "--runtime-env-agent-port", str(others[5]),
        "--metrics-export-port", str(others[6]), "--dashboard-port", str(others[7]),
    ]  # fmt: skip
    try:
        proc = subprocess.run(cmd, env=_plain_env(), capture_output=True, text=True, timeout=180)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        yield {"address": f"127.0.0.1:{port}", "root": root}
    finally:
        _stop_processes_naming(root)
        shutil.rmtree(root, ignore_errors=True)


def _python(code: str, env: dict[str, str], timeout: int = 300) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, env=env, capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc.stdout


def _driver_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RPG_", "RAY_ADDRESS"))}
    env.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".venv" / "torch_extensions"))
    env.update(HF_HUB_OFFLINE="1", RAY_USAGE_STATS_ENABLED="0", **extra)
    return env


@pytest.mark.slow
def test_backend_is_decided_by_the_joined_cluster(ray_head) -> None:
    out = _python(
        f"""
        import json
        from rpg_openrlhf.launch.cli import resolve_backend
        print(json.dumps([resolve_backend("auto", {ray_head["address"]!r}), resolve_backend("gpu", {ray_head["address"]!r})]))
        """,
        _driver_env(CUDA_VISIBLE_DEVICES=""),  # a GPU-less driver
    )
    (auto, auto_reason), (gpu, gpu_reason) = json.loads(out.strip().splitlines()[-1])
    assert auto == "cpu" and "logical" in auto_reason and ray_head["address"] in auto_reason
    assert gpu == "gpu" and "2 GPUs" in gpu_reason  # explicit gpu from a GPU-less driver is allowed


@pytest.mark.slow
def test_cpu_backend_never_joins_a_stray_cluster(ray_head) -> None:
    out = _python(
        """
        from types import SimpleNamespace as ns
        import ray
        from rpg_openrlhf.cpu_backend import driver

        ray.init(logging_level="ERROR")  # what OpenRLHF's ray.init() does: finds the address file
        stray = ray.get_runtime_context().gcs_address
        ray.shutdown()
        args = ns(actor=ns(num_nodes=1, num_gpus_per_node=1), algo=ns(kl=ns(init_coef=0.0)),
                  critic=ns(model_name_or_path=None), reward=ns(remote_url=["r.py"]), vllm=ns(num_engines=1))
        driver.start(args)
        print("STRAY", stray, "OWN", ray.get_runtime_context().gcs_address, ray.cluster_resources().get("GPU"))
        ray.shutdown()
        """,
        _driver_env(RAY_TMPDIR=ray_head["root"]),
    )
    _, stray, _, own, gpus = out.strip().splitlines()[-1].split()
    assert stray.endswith(ray_head["address"].split(":")[1])  # the trap is real: ray.init() joined the head
    assert own != stray and float(gpus) == 1.0  # the CPU backend started its own Ray (1 logical GPU)


def _stock_grpo(model: Path, prompts: Path, out: Path, max_steps: int, resume: bool) -> list[str]:
    return [
        sys.executable, "-m", "rpg_openrlhf.launch.cli", "--rpg.backend", "auto",
        "--actor.model_name_or_path", str(model),
        "--reward.remote_url", str(REPO / "rpg_openrlhf" / "plugin" / "reward.py"),
        "--data.prompt_dataset", str(prompts), "--data.input_key", "input", "--data.label_key", "label",
        "--algo.advantage.estimator", "group_norm", "--rollout.n_samples_per_prompt", "2",
        "--algo.kl.init_coef", "0", "--actor.num_nodes", "1", "--actor.num_gpus_per_node", "1",
        "--rollout.batch_size", "2", "--train.batch_size", "4",
        "--rollout.micro_batch_size", "2", "--train.micro_batch_size", "2",
        "--rollout.max_new_tokens", "8", "--data.max_len", "32", "--ds.zero_stage", "0", "--vllm.num_engines", "1",
        "--ckpt.save_hf", "--ckpt.save_steps", "5", "--ckpt.path", str(out / "ckpt"),
        "--ckpt.output_dir", str(out / "final"), "--train.num_episodes", "3", "--actor.adam.lr", "1e-3",
        "--rpg.max_steps", str(max_steps), *(["--ckpt.load_enable"] if resume else []),
    ]  # fmt: skip


def _run(cmd: list[str], env: dict[str, str]) -> str:
    return run_pipeline(cmd, env, RUN_TIMEOUT)


def _steps(out: str) -> dict[int, dict]:
    import ast
    import re

    return {
        int(m.group(1)): ast.literal_eval(m.group(2).replace("nan", "None").replace("inf", "None"))
        for m in re.finditer(r"Global step (\d+): (\{.*\})", out)
    }


@pytest.mark.e2e
def test_run_on_an_existing_cluster_grades_with_the_paper_grader_and_stops_at_the_budget(
    ray_head, tiny_vllm_model_dir: Path, tmp_path: Path
) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"input": q, "label": a}) + "\n" for q, a in PROMPTS))
    env = _driver_env(RAY_ADDRESS=ray_head["address"], RPG_REWARD_GRADER="paper")

    out = _run(_stock_grpo(tiny_vllm_model_dir, prompts, tmp_path, max_steps=2, resume=False), env)
    assert f"auto -> cpu (the Ray cluster at RAY_ADDRESS={ray_head['address']}" in out
    steps = _steps(out)
    assert sorted(steps) == [1, 2], explain(out)  # the data allows 6 (3 episodes x 2 batches)
    for status in steps.values():
        # The workers graded with the paper's grader (+1/-1): a random model never answers, so -1;
        # math-verify, what they would use without the variable, gives 0.
        assert status["reward"] == -1.0 and status["rollout/reward_mean"] == -1.0, status
        assert status["reward_error"] == 0.0
    ckpt = tmp_path / "ckpt"
    assert (ckpt / "_actor" / "latest").read_text().strip() == "global_step2"  # Last = the budget step
    assert (ckpt / "global_step2_hf" / "config.json").is_file() and not (ckpt / "global_step1_hf").exists()
    assert "reached --rpg.max_steps 2" in out

    out = _run(_stock_grpo(tiny_vllm_model_dir, prompts, tmp_path, max_steps=3, resume=True), env)
    steps = _steps(out)
    assert sorted(steps) == [3], explain(out)  # resumed at step 2, exactly one more step
    assert steps[3]["rollout/reward_mean"] == -1.0
    assert (ckpt / "_actor" / "latest").read_text().strip() == "global_step3"
    assert (ckpt / "global_step3_hf" / "config.json").is_file()
