"""The engine-vs-actor sync record's wiring (rpg_openrlhf/common/sync_check.py, seam ``sync_check``):
only with ``RPG_SYNC_CHECK_DIR``, through the hook ``rpg-train`` gives a GPU run's workers, and nothing
of it otherwise. The record itself runs in every CPU E2E test
(tests/helpers/engine_sync.py) and in the GPU tier."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from rpg_openrlhf.common import sync_check

REPO = Path(__file__).resolve().parents[1]


class _Trainer:
    def broadcast_to_vllm(self) -> None:
        self.synced = True


def test_wraps_the_sync_only_when_asked(monkeypatch, tmp_path: Path) -> None:
    module = SimpleNamespace(ActorPPOTrainer=_Trainer)
    monkeypatch.delenv(sync_check.SYNC_CHECK_ENV, raising=False)
    sync_check.use_sync_check(module)
    assert module.ActorPPOTrainer.broadcast_to_vllm is _Trainer.__dict__["broadcast_to_vllm"]
    monkeypatch.setenv(sync_check.SYNC_CHECK_ENV, str(tmp_path))
    recorded = []
    monkeypatch.setattr(sync_check, "record_engine_sync", lambda trainer, out: recorded.append(out))
    sync_check.use_sync_check(module)
    trainer = _Trainer()
    trainer.broadcast_to_vllm()
    assert trainer.synced and recorded == [str(tmp_path)]  # the original sync, then the record


def test_the_gpu_worker_hook_applies_it_to_openrlhfs_trainer(tmp_path: Path) -> None:
    """In a fresh process, as a Ray worker: the hook, then OpenRLHF's trainer module is imported (on this
    CPU machine with the stand-in flash_attn; a GPU node has the real one). The CPU backend's worker hook
    is the one every CPU E2E run's sync records come through (tests/helpers/engine_sync.py)."""
    code = (
        "from rpg_openrlhf.cpu_backend.standins import provide_stand_ins; provide_stand_ins()\n"
        "from rpg_openrlhf.common.sync_check import worker_setup; worker_setup()\n"
        "import openrlhf.trainer.ray.ppo_actor as m\n"
        "print(m.ActorPPOTrainer.broadcast_to_vllm.__module__)\n"
    )
    env = {"RPG_SYNC_CHECK_DIR": str(tmp_path), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "rpg_openrlhf.common.sync_check"


def test_gpu_ray_start_adds_the_hook_only_when_asked(monkeypatch, tmp_path: Path) -> None:
    import ray

    from rpg_openrlhf.launch import cluster

    calls = []
    monkeypatch.setattr(ray, "init", lambda **kw: calls.append(kw["runtime_env"]))
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.delenv(sync_check.SYNC_CHECK_ENV, raising=False)
    cluster.init_ray_gpu()
    monkeypatch.setenv(sync_check.SYNC_CHECK_ENV, str(tmp_path))
    cluster.init_ray_gpu()
    assert "worker_process_setup_hook" not in calls[0]
    assert calls[1]["worker_process_setup_hook"] == "rpg_openrlhf.common.sync_check.worker_setup"
    assert calls[1]["env_vars"][sync_check.SYNC_CHECK_ENV] == str(tmp_path)  # an RPG_* variable, forwarded


def test_actor_log_probs_in_chunks_equal_the_full_float64_log_softmax(monkeypatch) -> None:
    """The actor side of the record is computed a few positions at a time (no [T, V] float64 logits):
    the same values as the full-vocabulary float64 log-softmax of the model's logits."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    import rpg_openrlhf.core.logprobs as core_logprobs

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=101, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=False,
    )  # fmt: skip
    model = Qwen2ForCausalLM(config).eval()
    calls = []
    monkeypatch.setattr(core_logprobs, "chunk_tokens_for", lambda vocab, dtype: calls.append(vocab) or 4)
    sequences = [list(s) for s in sync_check.SYNC_CHECK_SEQUENCES]
    rows, _ = sync_check._actor_forward(model, model.state_dict(), sequences)
    assert calls == [101] * len(sequences)
    with torch.no_grad():
        for seq, row in zip(sequences, rows):
            ids = torch.tensor([seq])
            full = model(input_ids=ids).logits[0, :-1].double().log_softmax(-1)
            expected = full.gather(-1, ids[0, 1:, None])[:, 0]
            assert row.dtype == torch.float64 and row.shape == expected.shape
            torch.testing.assert_close(row, expected, rtol=0, atol=1e-6)
