"""The check's training run: ``rpg-train --backend gpu`` on a tiny model, with the sync check, the step
dumps and an NVML memory sampler. Everything it writes goes under one directory."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from rpg_openrlhf.common.atomic import write_file

#: Arithmetic prompts, enough for 2 per GPU and step on 8 GPUs; the reward only needs a digit
#: (tests/helpers/reward_has_digit.py's rule).
PROMPTS = [(f"{a}+{b}=", str(a + b)) for a in range(8) for b in range(8)]
REWARD = Path(__file__).resolve().parents[2] / "tests" / "helpers" / "reward_has_digit.py"


def prepare(out: Path, seq_len: int) -> tuple[Path, Path]:
    """The tiny model (head size 32, positions for ``seq_len``) and the prompt file, under ``out``."""
    from rpg_openrlhf.tinymodel import build_tiny_model

    model = build_tiny_model(out / "model", seed=0, heads=2, kv_heads=1, max_positions=seq_len + 64)
    prompts = out / "prompts.jsonl"
    write_file(prompts, "".join(json.dumps({"input": q, "label": a}) + "\n" for q, a in PROMPTS))
    return model, prompts


#: Token budgets of the 8K path's dynamic micro-batches at the check's size: a rank's 8 samples of ~20
#: tokens (prompt + 16 new) make 3-4 training micro-batches, so the step accumulates across them.
TRAIN_TOKENS, ROLLOUT_TOKENS = 48, 96


def command(out: Path, model: Path, prompts: Path, gpus: int, seq_len: int, steps: int) -> list[str]:
    """rpg-train's argv: the 8K configs' GPU shape (colocated, both sleeps, bf16, flash-attention, ZeRO-2,
    packed samples in dynamic micro-batches, so the grad-boundary fix is on) at a tiny size, on ``gpus``
    GPUs (NCCL across all of them: 8 samples per rank); RPG-RKL with dual clip, pi_ref = the initial
    model (a reference actor)."""
    return [
        sys.executable, "-m", "rpg_openrlhf.launch.cli", "--backend", "gpu",
        "--actor.model_name_or_path", str(model), "--reward.remote_url", str(REWARD),
        "--data.prompt_dataset", str(prompts), "--data.input_key", "input", "--data.label_key", "label",
        "--actor.num_nodes", "1", "--actor.num_gpus_per_node", str(gpus), "--ref.num_gpus_per_node", str(gpus),
        "--vllm.num_engines", str(gpus), "--vllm.gpu_memory_utilization", "0.3",
        "--train.colocate_all", "--ds.enable_sleep", "--vllm.enable_sleep",
        "--ds.zero_stage", "2", "--ds.param_dtype", "bf16", "--ds.attn_implementation", "flash_attention_2",
        "--ds.packing_samples", "--train.dynamic_batch_enable", "--train.max_tokens_per_gpu", str(TRAIN_TOKENS),
        "--rollout.max_tokens_per_gpu", str(ROLLOUT_TOKENS),
        "--rollout.n_samples_per_prompt", "4", "--rollout.batch_size", str(2 * gpus),
        "--train.batch_size", str(8 * gpus), "--rollout.micro_batch_size", "2", "--train.micro_batch_size", "2",
        "--rollout.max_new_tokens", "16", "--data.max_len", str(seq_len + 16),
        "--train.num_episodes", str(steps + 1), "--rpg.max_steps", str(steps),
        "--actor.adam.lr", "1e-2", "--actor.lr_scheduler", "constant",
        "--rpg.loss", "rkl", "--rpg.style", "differentiable", "--rpg.beta", "0.5", "--rpg.clip_c", "10",
        "--rpg.ref_update", "initial", "--actor.eps_clip_low_high", "0.2", "0.28",
        "--ckpt.path", str(out / "ckpt"), "--ckpt.output_dir", str(out / "final"),
    ]  # fmt: skip


def environment(out: Path, seq_len: int) -> dict[str, str]:
    """The run's environment: the sync check and step dumps under ``out``; no CPU-backend settings."""
    env = {k: v for k, v in os.environ.items() if k not in ("DS_ACCELERATOR", "TORCH_EXTENSIONS_DIR")}
    env.update({
        "RPG_SYNC_CHECK_DIR": str(out / "sync"), "RPG_SYNC_CHECK_LENGTHS": str(seq_len),
        "RPG_STEP_DUMP_DIR": str(out / "dump"), "RPG_STEP_DUMP_GRAD_STEP": "1",
    })  # fmt: skip
    return env


class MemorySampler(threading.Thread):
    """Peak used memory of every GPU (NVML), sampled every ``interval`` seconds until stopped."""

    def __init__(self, interval: float = 0.2) -> None:
        super().__init__(daemon=True)
        self.interval, self.peak_mib, self.total_mib = interval, {}, {}
        self._stop_event = threading.Event()

    def run(self) -> None:
        import pynvml

        pynvml.nvmlInit()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        while not self._stop_event.is_set():
            for i, handle in enumerate(handles):
                info = pynvml.nvmlDeviceGetMemoryInfo(handle)
                self.peak_mib[i] = max(self.peak_mib.get(i, 0), info.used // 2**20)
                self.total_mib[i] = info.total // 2**20
            time.sleep(self.interval)
        pynvml.nvmlShutdown()

    def stop(self) -> dict[str, dict[int, int]]:
        self._stop_event.set()
        self.join(timeout=5)
        return {"peak_mib": self.peak_mib, "total_mib": self.total_mib}


def run(out: Path, gpus: int, seq_len: int, steps: int, timeout: float) -> int:
    """Run the pipeline once; ``log.txt``, ``memory.json`` and ``run.json`` land in ``out``. Its exit status."""
    model, prompts = prepare(out, seq_len)
    argv = command(out, model, prompts, gpus, seq_len, steps)
    sampler = MemorySampler()
    sampler.start()
    start = time.time()
    with open(out / "log.txt", "w") as log:
        # its own session: on a timeout the whole tree (Ray's processes too) is killed, not just rpg-train
        proc = subprocess.Popen(argv, env=environment(out, seq_len), stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = 124
    write_file(out / "memory.json", json.dumps(sampler.stop()))
    write_file(out / "run.json", json.dumps({"argv": argv, "returncode": rc, "wall_s": time.time() - start,
                                            "gpus": gpus, "seq_len": seq_len, "steps": steps}))  # fmt: skip
    return rc
