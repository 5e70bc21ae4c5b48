"""The ``no_ray`` fixture of the tests of rpg-train's start path (without --dry-run) that must stop
before Ray: tests/test_preflight.py (--rpg.* combinations such as
test_schedulefree_combinations_deepspeed_cannot_run; a dry run refuses the same: tests/test_rpg_flags.py),
tests/test_ref_refresh.py, tests/test_checkpoint_careless.py."""

from __future__ import annotations

import pytest


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
