"""rpg-train refuses invalid ``--rpg.*`` values before Ray starts (the real parser, in-process,
*without* --dry-run, with ``ray.init`` booby-trapped). The combinations a dry run refuses, each
naming its flags, are tests/test_rpg_flags.py's; this is the start path."""

from __future__ import annotations

import pytest
from test_rpg_flags import BASE  # a config-only model directory and a real reward file

INVALID = [
    (["--rpg.loss", "fkl", "--rpg.beta", "nan"], "--rpg.beta"),  # a value (the core's rule)
    (["--rpg.loss", "fkl", "--train.async_enable"], "--train.async_enable"),  # a combination
]


@pytest.fixture
def no_ray(monkeypatch: pytest.MonkeyPatch):
    """Any attempt to start or join Ray fails the test."""
    import ray

    def trap(*args, **kwargs):
        raise AssertionError("ray.init was called: the configuration error came too late")

    monkeypatch.setattr(ray, "init", trap)
    from rpg_openrlhf.cpu_backend import driver

    monkeypatch.setattr(driver, "start", trap)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("RPG_REWARD_GRADER", raising=False)
    yield
    assert not ray.is_initialized()


@pytest.mark.parametrize(("argv", "flag"), INVALID, ids=[" ".join(a[:4]) for a, _ in INVALID])
def test_invalid_rpg_value_fails_before_ray(argv, flag, no_ray, capsys) -> None:
    from rpg_openrlhf.launch.cli import main

    with pytest.raises(SystemExit) as info:
        main([*BASE, *argv])  # no --dry-run: the real start path
    err = capsys.readouterr().err
    assert info.value.code == 2 and flag in err and "Traceback" not in err, err
