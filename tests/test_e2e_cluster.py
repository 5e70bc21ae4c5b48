"""``rpg-train`` on a Ray cluster started beforehand, as the paper's runs are (issue #11 items 3-5).

The module starts its own Ray head on localhost (``ray start --head``: its own temp dir and free ports,
logical GPUs, a plain environment without ``RPG_*`` or DeepSpeed settings) and stops exactly that one at
the end (the processes naming its temp dir, and their children; never ``ray stop``). Against it:

* ``--rpg.backend auto`` decides from the cluster (logical GPUs, no CUDA -> cpu) and ``gpu`` is
  accepted from this GPU-less driver because the cluster offers GPUs;
* a plain ``ray.init()`` would join that cluster through the address file; the CPU backend starts
  its own local Ray instead;
* docs/training.md's stock GRPO run ("A first run on CPU", read from there: 2 steps, no ``--rpg.*``)
  through ``python -m rpg_openrlhf.cpu_backend`` alone joins it with ``RAY_ADDRESS``: the driver loads
  nothing of RPG or of the eval package, OpenRLHF's own vLLM engine actor and sync calls run, the
  workers get the driver's ``RPG_*`` variables (``RPG_SYNC_CHECK_DIR``: after every sync the engine's
  log-probs equal an fp32 forward of the actor's weights), and the actor trains and checkpoints.
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
from pathlib import Path

import budgets
import pytest
from engine_sync import assert_engines_follow_actor
from pipeline_run import REPO, docs_command, run_pipeline, run_python, write_prompts
from run_log import explain

#: What a stock CPU run must not load (tests/test_layering.py holds it for the code; this is the run).
NOT_LOADED = (
    "rpg_eval",
    "rpg_openrlhf.core",
    "rpg_openrlhf.plugin",
    "rpg_openrlhf.launch",
    "rpg_openrlhf.extras",
)
DRIVER = (
    "import sys\n"
    "from rpg_openrlhf.cpu_backend.__main__ import main\n"
    "main(sys.argv[1:])\n"
    f"print('LOADED', sorted(m for m in sys.modules if m.startswith({NOT_LOADED!r})))\n"
)


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


def _driver_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RPG_", "RAY_ADDRESS"))}
    env.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".venv" / "torch_extensions"))
    env.update(HF_HUB_OFFLINE="1", RAY_USAGE_STATS_ENABLED="0", **extra)
    return env


@pytest.mark.slow
def test_backend_is_decided_by_the_joined_cluster(ray_head) -> None:
    out = run_python(
        f"""
        import json
        from rpg_openrlhf.launch.cli import resolve_backend
        print(json.dumps([resolve_backend("auto", {ray_head["address"]!r}), resolve_backend("gpu", {ray_head["address"]!r})]))
        """,
        env=_driver_env(CUDA_VISIBLE_DEVICES=""),  # a GPU-less driver
    )
    (auto, auto_reason), (gpu, gpu_reason) = json.loads(out.strip().splitlines()[-1])
    assert auto == "cpu" and "logical" in auto_reason and ray_head["address"] in auto_reason
    assert gpu == "gpu" and "2 GPUs" in gpu_reason  # explicit gpu from a GPU-less driver is allowed


@pytest.mark.slow
def test_cpu_backend_never_joins_a_stray_cluster(ray_head) -> None:
    out = run_python(
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
        env=_driver_env(RAY_TMPDIR=ray_head["root"]),
    )
    _, stray, _, own, gpus = out.strip().splitlines()[-1].split()
    assert stray.endswith(ray_head["address"].split(":")[1])  # the trap is real: ray.init() joined the head
    assert own != stray and float(gpus) == 1.0  # the CPU backend started its own Ray (1 logical GPU)


@pytest.mark.e2e
def test_stock_grpo_through_the_cpu_backend_alone_on_an_existing_cluster(
    ray_head, tiny_vllm_model_dir: Path, tmp_path: Path
) -> None:
    out, model = tmp_path / "run", tiny_vllm_model_dir
    flags = docs_command("## A first run on CPU", model, write_prompts(tmp_path / "p.jsonl"), out)[3:]
    env = _driver_env(RAY_ADDRESS=ray_head["address"], RPG_SYNC_CHECK_DIR=str(tmp_path / "sync"))
    for key in ("DS_ACCELERATOR", "DS_BUILD_OPS"):  # a plain shell must work
        env.pop(key, None)
    log = run_pipeline([sys.executable, "-c", DRIVER, *flags], env, budgets.START_S)
    (tmp_path / "log.txt").write_text(log)  # kept for a failure's diagnosis (pytest --basetemp)
    assert "LOADED []" in log, explain(log)
    joined = f"joining the Ray cluster at RAY_ADDRESS={ray_head['address']} (workers get "
    assert joined in log and "'RPG_SYNC_CHECK_DIR'" in log.split(joined, 1)[1].split(")", 1)[0], explain(log)
    assert "--ds.attn_implementation flash_attention_2 -> sdpa" in log  # OpenRLHF's default, adjusted
    assert "Global step 2" in log, explain(log)
    # OpenRLHF's own engine actor ran; its syncs are the sync records below (the engine-core process's
    # own lines, "[vLLM-CPU] weights updated", do not reach the log of a joined cluster's run)
    assert "rollout engine vllm" in log, explain(log)
    # the engine actor watches its engine-core process; it did not end during the run (no line about
    # its end before the last step's log line: when Ray stops the engine at the run's end, a request
    # still in flight may fail and print the SIGKILL of that stop: seen once)
    end = log.rfind("Global step 2:")
    assert "[vLLM-CPU] engine-core process " in log and "[vLLM-CPU] ERROR" not in log[:end], explain(log)
    assert_engines_follow_actor(tmp_path / "sync", syncs=2)  # the workers got RPG_SYNC_CHECK_DIR
    for step in (1, 2):
        assert (out / "ckpt" / f"global_step{step}_hf" / "config.json").is_file()
    final = out / "final"
    assert (final / "config.json").is_file() and (final / "model.safetensors").is_file()
    # The actor trained (lr 1e-3) and its final weights differ from the initial model.
    from safetensors.torch import load_file

    before = load_file(str(model / "model.safetensors"))
    after = load_file(str(final / "model.safetensors"))
    assert set(before) <= set(after)  # the checkpoint also spells out the tied lm_head
    # compare in the checkpoint's dtype (bf16 training saves bf16): rounding alone is no change
    assert any(not before[k].to(after[k].dtype).equal(after[k]) for k in before)
