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
    experience = SimpleNamespace(base_action_log_probs=ref if use_reference else None, info={})
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


def _corrected_urkl_by_formula(logp, old, rollout, adv, mask, level, low, high, beta):
    """The whole-loss correction written out: L_t = -w A + beta (w log w - w + 1) (URKL, plain reward
    term, pi_ref = pi_old), weighted by c = pi_old/mu per token or per sequence, masked outside
    [low, high] of the ratio (token) or of its geometric mean (seq); token mean over the mask."""
    w = (logp - old).exp()
    per_token = -w * adv + beta * (w * w.log() - w + 1)
    r = (old - rollout) * mask
    if level == "token":
        stat, c, units = r.exp(), r.exp(), mask
    else:
        n = mask.sum(-1, keepdim=True)
        stat, c, units = (
            (r.sum(-1, keepdim=True) / n).exp(),
            r.sum(-1, keepdim=True).exp(),
            mask.amax(-1, keepdim=True),
        )
    out = (stat < low) | (stat > high)
    c = torch.where(out, 0.0, c)
    loss = (c * per_token * mask).sum() / mask.sum()
    metrics = {
        "vllm_kl": ((rollout - old) * mask).sum() / mask.sum(),
        "is_filter_ratio": (out * units).sum() / units.sum(),
        "is_weight_mean": (c * units).sum() / units.sum(),
    }
    return loss, metrics


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

    expected, metrics = _corrected_urkl_by_formula(logp, old, rollout, adv, mask, level, low, high, 0.1)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    g1, g2 = torch.autograd.grad(loss, logp)[0], torch.autograd.grad(expected, logp)[0]
    torch.testing.assert_close(g1, g2, rtol=1e-5, atol=1e-7)
    assert 0 < metrics["is_filter_ratio"] < 1  # the band filters some units, not all
    assert vllm_kl.item() == pytest.approx(metrics["vllm_kl"].item(), rel=1e-6)
    assert is_filter.item() == pytest.approx(metrics["is_filter_ratio"].item())
    assert experience.info["rpg/is_weight_mean"].item() == pytest.approx(
        metrics["is_weight_mean"].item(), rel=1e-6
    )
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


def test_rollout_reference_ignores_experience_reference():
    """--rpg.ref_update rollout: pi_ref = pi_old, so core gets ref_logp=None."""
    logp, old, adv, mask, ref = _batch(1)
    fn = _loss_fn("urkl", "reinforce_clip", use_reference=False, clip_c=10.0)
    fn.experience = SimpleNamespace(base_action_log_probs=ref, info={})
    loss = fn(logp, old, adv, action_mask=mask)[0]
    expected = core.compute_loss("urkl", "reinforce_clip", logp, old, adv, mask, None, config=fn.config)[0]
    assert torch.equal(loss, expected)


def _experience(rewards, index, t=5):
    from openrlhf.trainer.ppo_utils.experience import Experience

    b = len(rewards)
    mask = torch.ones(b, t, dtype=torch.bool)
    mask[0, 3:] = False
    return Experience(
        sequences=torch.zeros(b, t + 2, dtype=torch.long),
        attention_mask=torch.ones(b, t + 2, dtype=torch.long),
        action_mask=mask,
        rewards=torch.tensor(rewards),
        response_length=mask.sum(-1).float(),
        total_length=mask.sum(-1).float() + 2,
        kl=torch.zeros(b, t),
        index=index,
        info={},
    )


@pytest.mark.parametrize("baseline", ["mean", "mean_std", "loo", "none"])
def test_rpg_advantage_estimator_is_core_group_advantages(baseline):
    from openrlhf.trainer.ppo_utils.kl_controller import FixedKLController

    from rpg_openrlhf.plugin.trainer import RPGExperienceMaker

    args = SimpleNamespace(
        algo=SimpleNamespace(
            advantage=SimpleNamespace(estimator="rpg", gamma=1.0, lambd=1.0, no_std_norm=False),
            kl=SimpleNamespace(use_loss=False),
        ),
        rollout=SimpleNamespace(n_samples_per_prompt=3),
        reward=SimpleNamespace(
            clip_range=(-10, 10), overlong_buffer_len=None, stop_properly_penalty_coef=None
        ),
        rpg=SimpleNamespace(advantage=baseline),
    )
    maker = RPGExperienceMaker(
        None, None, None, None, FixedKLController(0.0), SimpleNamespace(args=args), None
    )
    # Two micro-batches whose samples are shuffled w.r.t. the prompt-major order.
    raw = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, -1.0])  # prompt 0: rows 0-2, prompt 1: rows 3-5
    order = [[4, 0, 2], [1, 5, 3]]
    exps = [_experience([raw[i].item() for i in idx], idx) for idx in order]
    out = maker.compute_advantages_and_returns(exps)
    expected = core.group_advantages(raw, 3, baseline)
    for exp, idx in zip(out, order):
        want = core.broadcast_to_tokens(expected[idx], exp.action_mask)
        assert torch.allclose(exp.advantages, want.to(exp.advantages.dtype))
        assert torch.allclose(exp.info["return"], raw[idx])


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
    monkeypatch.setattr(trainer_mod.ray, "put", lambda x: x)
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
            # reference (ref_refresh.send: only rank 0 fetches it)
            assert [r for r, _ in loaded[-2:]] == [0, 1]
            assert all(torch.equal(s[0]["w"], weights["w"]) for _, s in loaded[-2:])
    assert refreshed == refresh_steps
    assert status["rpg/ref_refreshes"] == len(refresh_steps)
    assert len(loaded) == 2 * len(refresh_steps)
