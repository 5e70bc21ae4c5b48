"""rpg-train refuses invalid ``--rpg.*`` combinations before Ray starts (the real parser, in-process,
*without* --dry-run, with ``ray.init`` booby-trapped)."""

from __future__ import annotations

import pytest
from test_rpg_flags import BASE  # a config-only model directory and a real reward file

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
