"""The CPU backend starts its local Ray again when the raylet missed Ray's fixed 30 s to register (a
loaded machine: seen in a suite run beside other work), and only then."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import ray

from rpg_openrlhf.cpu_backend import driver

TIMEOUT = Exception("The current node timed out during startup. This could happen because ...")


@pytest.fixture
def fake_ray(monkeypatch):
    calls = {"init": 0, "shutdown": 0}
    outcomes: list[Exception | None] = []

    def init(**kwargs):
        calls["init"] += 1
        outcome = outcomes.pop(0)
        if outcome is not None:
            raise outcome

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(ray, "shutdown", lambda: calls.__setitem__("shutdown", calls["shutdown"] + 1))
    monkeypatch.setattr(driver, "logical_gpus_needed", lambda args: 2)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    return calls, outcomes


ARGS = SimpleNamespace(vllm=SimpleNamespace(num_engines=1))


def test_a_start_timeout_is_retried(fake_ray, capsys) -> None:
    calls, outcomes = fake_ray
    outcomes += [TIMEOUT, None]
    driver._start_ray(ARGS, {"env_vars": {}})
    assert calls == {"init": 2, "shutdown": 1}
    assert "starting it again (2/3)" in capsys.readouterr().out


def test_three_timeouts_and_other_errors_propagate(fake_ray) -> None:
    calls, outcomes = fake_ray
    outcomes += [TIMEOUT] * 3
    with pytest.raises(Exception, match="timed out during startup"):
        driver._start_ray(ARGS, {"env_vars": {}})
    assert calls == {"init": 3, "shutdown": 2}
    outcomes += [ValueError("bad argument")]
    with pytest.raises(ValueError):
        driver._start_ray(ARGS, {"env_vars": {}})
    assert calls["init"] == 4
