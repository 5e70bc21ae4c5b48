"""The RPG actor's loss is rpg_openrlhf.core's on the tensors OpenRLHF hands it; the RPG
advantage estimator is core.group_advantages after OpenRLHF's reward processing."""

from __future__ import annotations

from dataclasses import asdict
from types import SimpleNamespace

import pytest
import torch

from rpg_openrlhf import core


@pytest.fixture(scope="module", autouse=True)
def _stand_ins():
    from rpg_openrlhf.cpu_backend.standins import provide_stand_ins

    provide_stand_ins()  # openrlhf.trainer.ray imports vllm / flash_attn at import time


def _batch(seed: int = 0, b: int = 4, t: int = 6):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, t, generator=g) * 3
    logp = (old + 0.3 * torch.randn(b, t, generator=g)).clamp(max=0).requires_grad_(True)
    ref = old + 0.2 * torch.randn(b, t, generator=g)
    adv = torch.randn(b, generator=g)[:, None].expand(b, t).clone()
    mask = torch.ones(b, t)
    mask[0, 4:] = 0
    mask[2, 2:] = 0
    return logp, old, adv, mask, ref


def _loss_fn(name, style, use_reference, capture_dir=None, **cfg):
    from rpg_openrlhf.plugin.actor import RPGPolicyLoss

    return RPGPolicyLoss(
        name, style, core.LossConfig(**cfg), capture_dir=capture_dir, use_reference=use_reference
    )


@pytest.mark.parametrize(
    ("name", "style", "use_reference", "cfg"),
    [
        ("urkl", "reinforce_clip", False, {"clip_c": 10.0, "eps_high": 0.28}),
        ("ufkl", "differentiable", True, {}),
        ("fkl", "reinforce", True, {"beta": 0.05}),
        ("grpo_kl_corrected", "differentiable", True, {"aggregation": "seq-mean-token-mean"}),
        ("rkl", "differentiable", False, {"weight_level": "sequence"}),
    ],
)
def test_policy_loss_equals_core(name, style, use_reference, cfg, tmp_path):
    logp, old, adv, mask, ref = _batch()
    fn = _loss_fn(name, style, use_reference, capture_dir=str(tmp_path), **cfg)
    # the experience always holds reference log-probs; without a reference update (pi_ref = pi_old,
    # --rpg.ref_update rollout) the loss must ignore them
    experience = SimpleNamespace(base_action_log_probs=ref, info={})
    fn.experience = experience
    norm = {"dp_size": 2, "batch_num_tokens": torch.tensor(30.0), "global_batch_size": torch.tensor(8.0)}
    loss, clip_ratio, ppo_kl, vllm_kl, is_filter = fn(logp, old, adv, action_mask=mask, **norm)

    config = core.LossConfig(**cfg)
    if config.weight_level == "sequence":
        norm = {**norm, "batch_num_tokens": norm["global_batch_size"]}
    expected, metrics = core.compute_loss(
        name, style, logp, old, adv, mask, ref if use_reference else None, config=config, **norm
    )
    assert torch.equal(loss, expected)
    g1, g2 = torch.autograd.grad(loss, logp)[0], torch.autograd.grad(expected, logp)[0]
    assert torch.equal(g1, g2)
    assert vllm_kl is None and is_filter is None  # correction off: OpenRLHF logs neither
    assert clip_ratio.item() == pytest.approx(
        metrics["clip_frac_low"] + metrics["clip_frac_high"] + metrics["clip_frac_dual"]
    )
    assert ppo_kl.item() == pytest.approx(((old - logp.detach()) * mask).sum().item() / mask.sum().item())
    # Metrics reach OpenRLHF's logger through experience.info (0-d tensors: token-weighted).
    assert experience.info["kl"].item() == pytest.approx(metrics["kl"], nan_ok=True)
    for key in core.METRIC_NAMES:
        assert experience.info[f"rpg/{key}"].dim() == 0
    # The capture holds exactly the inputs and the loss the worker computed.
    (path,) = tmp_path.glob("loss_rank0_*.pt")
    rec = torch.load(path, weights_only=False)
    assert rec["config"] == asdict(config) and rec["name"] == name and rec["style"] == style
    again, _ = core.compute_loss(
        rec["name"], rec["style"], rec["logp"], rec["old_logp"], rec["advantages"], rec["action_mask"],
        rec["ref_logp"], config=core.LossConfig(**rec["config"]), dp_size=rec["dp_size"],
        batch_num_tokens=rec["batch_num_tokens"], global_batch_size=rec["global_batch_size"],
    )  # fmt: skip
    assert torch.equal(again, rec["loss"]) and torch.equal(rec["loss"], loss.detach())


@pytest.mark.parametrize("level", ["token", "seq"])
def test_policy_loss_with_rollout_correction(level, tmp_path):
    """With the correction on the loss is the weighted one, OpenRLHF gets (vllm_kl, is_filter_ratio)
    back to log under its own names, is_weight_mean goes under rpg/, the capture holds mu's log-probs."""
    logp, old, adv, mask, _ = _batch(3)
    rollout = old + 0.15 * torch.randn(old.shape, generator=torch.Generator().manual_seed(7))
    low, high = (0.9, 1.1) if level == "token" else (0.95, 1.05)
    correction = core.RolloutCorrection(level=level, mode="mask", gating="ratio", low=low, high=high)
    fn = _loss_fn("urkl", "differentiable", False, capture_dir=str(tmp_path), beta=0.1, clip_reward=False,
                  rollout_correction=correction)  # fmt: skip
    fn.experience = experience = SimpleNamespace(base_action_log_probs=None, info={})
    loss, _, _, vllm_kl, is_filter = fn(logp, old, adv, action_mask=mask, rollout_log_probs=rollout)

    expected, metrics = core.compute_loss("urkl", "differentiable", logp, old, adv, mask, config=fn.config,
                                          rollout_logp=rollout)  # fmt: skip
    assert torch.equal(loss, expected)  # the correction itself: tests/test_core_rollout_correction.py
    assert 0 < metrics["is_filter_ratio"] < 1  # the band filters some units, not all
    assert (vllm_kl.item(), is_filter.item()) == (metrics["vllm_kl"], metrics["is_filter_ratio"])
    assert experience.info["rpg/is_weight_mean"].item() == pytest.approx(metrics["is_weight_mean"])
    assert "rpg/vllm_kl" not in experience.info and "rpg/is_filter_ratio" not in experience.info
    (path,) = tmp_path.glob("loss_rank0_*.pt")
    assert torch.equal(torch.load(path, weights_only=False)["rollout_logp"], rollout)


def test_correction_without_engine_logprobs_fails():
    logp, old, adv, mask, _ = _batch()
    fn = _loss_fn("urkl", "differentiable", False, rollout_correction=core.RolloutCorrection(level="seq"))
    fn.experience = SimpleNamespace(base_action_log_probs=None, info={})
    with pytest.raises(RuntimeError, match="is_correction_level seq"):
        fn(logp, old, adv, action_mask=mask)


def test_reference_update_without_reference_logprobs_fails():
    logp, old, adv, mask, _ = _batch()
    fn = _loss_fn("ufkl", "differentiable", use_reference=True)
    fn.experience = SimpleNamespace(base_action_log_probs=None, info={})
    with pytest.raises(RuntimeError, match="reference log-probs"):
        fn(logp, old, adv, action_mask=mask)


def test_rpg_estimator_refuses_an_openrlhf_kl_coefficient():
    from openrlhf.trainer.ppo_utils.kl_controller import FixedKLController

    from rpg_openrlhf.plugin.trainer import RPGExperienceMaker

    args = SimpleNamespace(algo=SimpleNamespace(advantage=SimpleNamespace(estimator="rpg")))
    maker = RPGExperienceMaker(
        None, None, None, None, FixedKLController(0.1), SimpleNamespace(args=args), None
    )
    with pytest.raises(RuntimeError, match="KL coefficient"):
        maker.compute_advantages_and_returns([])


class _Group:
    """A stand-in actor group: async_run_method calls a local function per 'rank'."""

    def __init__(self, methods: dict, ranks: int = 2) -> None:
        self.methods, self.ranks, self.calls = methods, ranks, []

    def async_run_method(self, method_name, *args, **kwargs):
        self.calls.append(method_name)
        return [self.methods[method_name](rank, *args, **kwargs) for rank in range(self.ranks)]


@pytest.mark.parametrize(
    ("mode", "kwargs", "kls", "refresh_steps"),
    [
        ("every_k", {"k": 2}, [0.1, 0.1, 0.1, 0.1, 0.1], [2, 4]),
        ("kl_threshold", {"kappa": 0.5}, [0.2, 0.4, 1.2, 0.1, 0.3], [3]),
        ("initial", {}, [5.0, 5.0], []),
    ],
)
def test_trainer_refreshes_reference_on_schedule(monkeypatch, mode, kwargs, kls, refresh_steps):
    import rpg_openrlhf.plugin.trainer as trainer_mod

    monkeypatch.setattr(trainer_mod.ray, "get", lambda x: x)
    puts = []
    monkeypatch.setattr(trainer_mod.ray, "put", lambda x: puts.append(x) or x)
    weights = {"w": torch.zeros(2)}
    loaded = []
    actor = _Group({"rpg_state_dict": lambda rank: dict(weights) if rank == 0 else None})
    ref = _Group({"rpg_load_state_dict": lambda rank, state: loaded.append((rank, state))})
    steps = iter(kls)

    def parent_train_step(self, rollout_samples, global_step):
        weights["w"] = weights["w"] + 1  # the actor trains
        return {"kl": next(steps)}, global_step + 1

    monkeypatch.setattr(
        trainer_mod._StockPPOTrainerClass.__ray_actor_class__, "train_step", parent_train_step
    )
    trainer = object.__new__(trainer_mod._RPGPPOTrainer)
    trainer.args = SimpleNamespace(ds=SimpleNamespace(enable_sleep=False))
    trainer.actor_model_group, trainer.reference_model_group = actor, ref
    trainer.ref_schedule = core.ReferenceSchedule(mode, **kwargs)
    trainer.capture_dir = None
    step, refreshed = 0, []
    for _ in kls:
        status, step = trainer.train_step(None, step)
        if status["rpg/ref_refreshed"]:
            refreshed.append(step)
            # every reference rank got the one put of the actor's current weights, as a nested
            # reference (ref_refresh.send: Ray resolves top-level ObjectRefs per actor, nested ones
            # it leaves alone; only rank 0 fetches it)
            assert [r for r, _ in loaded[-2:]] == [0, 1]
            assert all(torch.equal(s[0]["w"], weights["w"]) for _, s in loaded[-2:])
    assert refreshed == refresh_steps
    assert status["rpg/ref_refreshes"] == len(refresh_steps)
    assert len(loaded) == 2 * len(refresh_steps) and len(puts) == len(refresh_steps)  # one put per refresh
