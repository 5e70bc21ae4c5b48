"""Hardening: training configuration, non-finite inputs, resume.

* invalid ``--rpg.*`` combinations fail before Ray starts (the real parser, in-process,
  *without* --dry-run, with ``ray.init`` booby-trapped);
* NaN / inf log-probs or advantages raise a clear ValueError naming the argument, for every
  registered loss, instead of a silent NaN loss; extreme but finite inputs stay finite; a fully
  masked batch raises (its own mean is 0/0) or, with the step's normalizers, adds exactly 0;
* a run resumed from an OpenRLHF checkpoint restores the reference schedule state and the
  reference weights.
"""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

# Dry runs check that the model and the reward file exist: a config-only model directory (never
# loaded) and a real reward file.
_TESTS = Path(__file__).resolve().parent
BASE = [
    "--actor.model_name_or_path", str(_TESTS / "data" / "dry_run_model"),
    "--reward.remote_url", str(_TESTS / "reward_has_digit.py"),
    "--rollout.n_samples_per_prompt", "4",
    "--rpg.backend", "cpu",
]  # fmt: skip

INVALID = [
    (["--rpg.loss", "fkl", "--rpg.beta", "nan"], "--rpg.beta"),
    (["--rpg.loss", "fkl", "--rpg.beta", "inf"], "--rpg.beta"),
    (["--rpg.loss", "fkl", "--rpg.beta", "-1e-4"], "--rpg.beta"),
    (["--rpg.loss", "rkl", "--rpg.clip_c", "nan", "--rpg.style", "reinforce_clip"], "--rpg.clip_c"),
    (["--rpg.loss", "rkl", "--rpg.clip_c", "1"], "--rpg.clip_c"),
    (["--rpg.loss", "ufkl", "--rpg.ref_update", "every_k", "--rpg.ref_update_k", "0"], "--rpg.ref_update_k"),
    (["--rpg.loss", "ufkl", "--rpg.ref_update", "every_k", "--rpg.ref_update_k", "-3"], "--rpg.ref_update_k"),
    (["--rpg.loss", "urkl", "--rpg.ref_update", "kl_threshold", "--rpg.ref_kl_threshold", "0"],
     "--rpg.ref_kl_threshold"),
    (["--rpg.loss", "urkl", "--rpg.ref_update", "kl_threshold", "--rpg.ref_kl_threshold", "-1"],
     "--rpg.ref_kl_threshold"),
    (["--rpg.loss", "urkl", "--rpg.ref_kl_threshold", "0.1"], "--rpg.ref_kl_threshold"),
    (["--rpg.loss", "fkl", "--algo.kl.use_loss"], "--algo.kl.use_loss"),
    (["--rpg.loss", "fkl", "--algo.kl.init_coef", "0.01"], "--algo.kl.init_coef"),
    (["--rpg.loss", "fkl", "--rollout.n_samples_per_prompt", "1"], "--rollout.n_samples_per_prompt"),
    (["--rpg.loss", "fkl", "--train.async_enable"], "--train.async_enable"),
    (["--rpg.loss", "fkl", "--actor.policy_loss_type", "gspo"], "--actor.policy_loss_type"),
    (["--rpg.style", "reinforce"], "--rpg.loss"),
    (["--rpg.loss", "nonsense"], "--rpg.loss"),
    (["--rpg.loss", "fkl", "--rpg.weight_level", "sentence"], "--rpg.weight_level"),
    (["--rpg.loss", "fkl", "--rpg.beta", "abc"], "--rpg.beta"),
]  # fmt: skip


@pytest.fixture
def no_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any attempt to start Ray fails the test."""
    import ray

    def trap(*args, **kwargs):
        raise AssertionError("ray.init was called: the configuration error came too late")

    monkeypatch.setattr(ray, "init", trap)
    from rpg_openrlhf.cpu_backend import driver

    monkeypatch.setattr(driver, "start", trap, raising=False)
    yield
    assert not ray.is_initialized()


@pytest.mark.parametrize(("argv", "flag"), INVALID, ids=[" ".join(a[:4]) for a, _ in INVALID])
def test_invalid_rpg_combination_fails_before_ray(argv, flag, no_ray, capsys) -> None:
    from rpg_openrlhf.launch.cli import main

    with pytest.raises(SystemExit) as info:
        main([*BASE, *argv])  # no --dry-run: the real start path
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert flag in err, err
    assert "Traceback" not in err


def test_valid_dry_run_does_not_start_ray(no_ray, capsys) -> None:
    from rpg_openrlhf.launch.cli import main

    main([*BASE, "--rpg.loss", "urkl", "--rpg.style", "reinforce_clip", "--dry-run"])
    assert '"rpg"' in capsys.readouterr().out


# --------------------------------------------------------------------------- non-finite inputs


def _inputs(seed: int = 0, b: int = 3, t: int = 5) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, t, generator=g) * 2 - 0.1
    return {
        "logp": (old + 0.1 * torch.randn(b, t, generator=g)).requires_grad_(True),
        "old_logp": old,
        "advantages": torch.randn(b, t, generator=g),
        "ref_logp": old + 0.05 * torch.randn(b, t, generator=g),
        "action_mask": torch.ones(b, t, dtype=torch.bool),
    }


def _variants() -> list[tuple[str, str]]:
    from rpg_openrlhf.core import LOSSES

    return sorted(LOSSES)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("arg", ["logp", "old_logp", "advantages", "ref_logp"])
def test_non_finite_inputs_raise_naming_the_argument(arg: str, bad: float) -> None:
    from rpg_openrlhf.core import LossConfig, compute_loss, token_losses

    for weight_level in ("token", "sequence"):
        cfg = LossConfig(weight_level=weight_level, clip_c=3.0)
        for name, style in _variants():
            x = _inputs()
            with torch.no_grad():
                x[arg][1, 2] = bad
            for fn in (compute_loss, token_losses):
                with pytest.raises(ValueError, match=rf"\b{arg}\b.*(NaN|nan|inf)"):
                    fn(name, style, config=cfg, **x)


@pytest.mark.parametrize("scale", [1e4, 1e30, 3e38])
def test_extreme_finite_inputs_give_finite_loss_and_gradient(scale: float) -> None:
    """Huge log-ratios are clamped (|log w| <= 20): no inf/NaN in loss, metrics or gradient."""
    from rpg_openrlhf.core import LossConfig, compute_loss

    for weight_level in ("token", "sequence"):
        cfg = LossConfig(weight_level=weight_level, clip_c=3.0)
        for name, style in _variants():
            x = _inputs()
            with torch.no_grad():
                x["logp"][0, 0] = -scale
                x["logp"][1, 1] = 0.0
                x["old_logp"][1, 1] = -scale
                x["ref_logp"][2, 2] = -scale
                x["advantages"][2] = scale / 1e30  # large but finite advantages
            loss, metrics = compute_loss(name, style, config=cfg, **x)
            loss.backward()
            assert torch.isfinite(x["logp"].grad).all(), (name, style, weight_level, scale)
            assert all(math.isfinite(v) for k, v in metrics.items() if k != "kl"), (name, style, metrics)
            if style.endswith("_released") and scale > 1e30:
                # The released REINFORCE value is -SG(coef) log pi with coef >= (1 - eps_low) A (the
                # weight is hard-clipped, it never shrinks): |log pi| = 3e38 can overflow float32 in
                # the value, as in the released code; the gradient (coef) stays finite (checked above).
                continue
            assert torch.isfinite(loss), (name, style, weight_level, scale)


@pytest.mark.parametrize("scope", ["step", "micro_batch"])
@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_fully_masked_batch_is_not_a_silent_nan(aggregation: str, scope: str) -> None:
    """All tokens masked. Alone (no normalizers) its mean is 0/0: a ValueError naming action_mask,
    never NaN or a made-up number. As one micro-batch of a step (OpenRLHF's normalizers) it adds
    exactly 0 with a zero gradient: the step's mean over its other tokens is untouched."""
    from rpg_openrlhf.core import LossConfig, compute_loss

    cfg = LossConfig(aggregation=aggregation, aggregation_scope=scope, clip_c=3.0)
    for name, style in _variants():
        x = _inputs()
        x["action_mask"] = torch.zeros_like(x["action_mask"])
        with pytest.raises(ValueError, match=r"^action_mask: every token is masked"):
            compute_loss(name, style, config=cfg, **x)
        loss, _ = compute_loss(
            name, style, config=cfg, dp_size=2, batch_num_tokens=7.0, global_batch_size=3.0, **x
        )
        (grad,) = torch.autograd.grad(loss, x["logp"])
        assert loss.item() == 0.0 and torch.equal(grad, torch.zeros_like(grad)), (name, style)


# --------------------------------------------------------------------------- resume


class _Group:
    """A stand-in for a Ray actor group: records the calls, returns ready values."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict]] = []

    def async_run_method(self, method_name: str, **kwargs):
        self.calls.append((method_name, kwargs))
        if method_name == "rpg_state_dict":
            return [{"w": torch.ones(2)}]
        return []


def test_checkpoint_carries_reference_schedule_and_weights(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    from rpg_openrlhf.cpu_backend.standins import provide_stand_ins

    provide_stand_ins()
    import ray

    monkeypatch.setattr(ray, "get", lambda refs: refs)
    monkeypatch.setattr(ray, "put", lambda obj: obj)
    from rpg_openrlhf import core
    from rpg_openrlhf.plugin.trainer import _RPGPPOTrainer

    schedule = core.ReferenceSchedule("every_k", k=3)
    for _ in range(4):
        schedule.observe(0.01)  # refreshed at step 3
    actor, reference = _Group(), _Group()
    args = SimpleNamespace(
        logger=SimpleNamespace(logging_steps=1),
        ckpt=SimpleNamespace(save_steps=1, path=str(tmp_path)),
        ds=SimpleNamespace(enable_sleep=False),
    )
    # An instance without __init__ (no Ray, no models): the overrides call super(), which a
    # SimpleNamespace standing in for self would not allow.
    trainer = object.__new__(_RPGPPOTrainer)
    trainer.__dict__.update(
        args=args, wandb_logger=None, tensorboard_logger=None, best_eval_metric_key=None,
        best_eval_metric_value=None, _latest_eval_metric_value=None, actor_model_group=actor,
        critic_model_group=None, reference_model_group=reference, ref_schedule=schedule,
    )  # fmt: skip
    trainer.save_logs_and_checkpoints(4, {}, {"global_step": 4})
    saved = [kw for name, kw in actor.calls if name == "save_checkpoint"]
    assert saved, "no checkpoint was saved"
    states = saved[0]["client_states"]
    assert any(v == schedule.state_dict() for v in states.values()), sorted(states)
    reference_saved = [n for n, _ in reference.calls if n in ("save_checkpoint", "rpg_state_dict")]
    assert reference_saved or any(p.suffix == ".pt" for p in tmp_path.rglob("*")), (
        "reference weights not saved"
    )

    # Resume: a fresh schedule and fresh reference actors get the checkpoint's state back.
    (tmp_path / "_actor").mkdir(exist_ok=True)
    args.ckpt.load_enable = True
    resumed_actor, resumed_reference = _Group(), _Group()
    resumed_actor.async_run_method = lambda method_name, **kw: (
        [states] if method_name == "get_checkpoint_states" else []
    )
    fresh = core.ReferenceSchedule("every_k", k=3)
    resumed = object.__new__(_RPGPPOTrainer)
    resumed.__dict__.update(
        args=args,
        actor_model_group=resumed_actor,
        reference_model_group=resumed_reference,
        ref_schedule=fresh,
    )
    assert resumed.init_checkpoint_states()["global_step"] == 4
    assert fresh.state_dict() == schedule.state_dict()
    (load,) = [kw for name, kw in resumed_reference.calls if name == "rpg_load_state_dict"]
    assert torch.equal(load["state"][0]["w"], torch.ones(2))  # [state]: ref_refresh.send
    assert fresh.observe(0.01) is False and fresh.observe(0.01) is True  # step 6 = 3 after the refresh


def test_resume_without_reference_weights_refuses(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """A refreshed schedule whose weights file is gone must not resume against the initial model."""
    from rpg_openrlhf.cpu_backend.standins import provide_stand_ins

    provide_stand_ins()
    import ray

    monkeypatch.setattr(ray, "get", lambda refs: refs)
    from rpg_openrlhf import core
    from rpg_openrlhf.plugin.trainer import _RPGPPOTrainer

    saved = core.ReferenceSchedule("every_k", k=1)
    saved.observe(0.0)
    (tmp_path / "_actor").mkdir()
    states = {"global_step": 1, "rpg_ref_schedule": saved.state_dict(), "rpg_ref_weights": "global_step1.pt"}
    actor = _Group()
    actor.async_run_method = lambda method_name, **kw: [states]
    trainer = object.__new__(_RPGPPOTrainer)
    trainer.__dict__.update(
        args=SimpleNamespace(ckpt=SimpleNamespace(path=str(tmp_path), load_enable=True)),
        actor_model_group=actor, reference_model_group=_Group(),
        ref_schedule=core.ReferenceSchedule("every_k", k=1),
    )  # fmt: skip
    with pytest.raises(RuntimeError, match="weights are missing"):
        trainer.init_checkpoint_states()
