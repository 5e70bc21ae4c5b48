"""Reference-policy refresh schedule."""

import pytest

from rpg_openrlhf.core import ReferenceSchedule


def run(schedule: ReferenceSchedule, kls: list[float]) -> list[bool]:
    return [schedule.observe(kl) for kl in kls]


def test_initial_and_rollout_never_refresh_explicitly():
    for mode in ("initial", "rollout"):
        s = ReferenceSchedule(mode)
        assert run(s, [5.0] * 10) == [False] * 10 and s.refreshes == []
    assert ReferenceSchedule("rollout").uses_old_policy and not ReferenceSchedule("initial").uses_old_policy


def test_every_k_refreshes_every_k_steps():
    s = ReferenceSchedule("every_k", k=3)
    assert run(s, [0.0] * 7) == [False, False, True, False, False, True, False]
    assert s.refreshes == [3, 6]


def test_kl_threshold_uses_a_running_mean_reset_at_refresh():
    s = ReferenceSchedule("kl_threshold", kappa=0.1)
    # means since the last refresh: 0.05, 0.1 (not > kappa), 0.1333 -> refresh; then 0.2 -> refresh
    assert run(s, [0.05, 0.15, 0.2, 0.2, 0.0, 0.05]) == [False, False, True, True, False, False]
    assert s.refreshes == [3, 4]
    assert s.running_kl == pytest.approx(0.025)


def test_kl_threshold_window():
    s = ReferenceSchedule("kl_threshold", kappa=0.1, kl_window=2)
    # window of 2: (0.0, 0.15) -> 0.075; (0.15, 0.06) -> 0.105 > 0.1
    assert run(s, [0.0, 0.15, 0.06]) == [False, False, True]
    s2 = ReferenceSchedule("kl_threshold", kappa=0.1)  # whole history: 0.07 -> no refresh
    assert run(s2, [0.0, 0.15, 0.06]) == [False, False, False]


@pytest.mark.parametrize(
    "kwargs", [dict(mode="every_k", k=3), dict(mode="kl_threshold", kappa=0.1, kl_window=3)]
)
def test_state_round_trip_continues_identically(kwargs):
    kls = [0.02, 0.3, 0.05, 0.01, 0.2, 0.2, 0.0, 0.4, 0.1, 0.0]
    a = ReferenceSchedule(**kwargs)
    run(a, kls[:5])
    b = ReferenceSchedule(**kwargs)
    b.load_state_dict(a.state_dict())
    assert run(a, kls[5:]) == run(b, kls[5:])
    assert a.state_dict() == b.state_dict() and a.refreshes


@pytest.mark.parametrize(
    "kwargs, arg",
    [
        (dict(mode="sometimes"), "mode"),
        (dict(mode="every_k"), "k"),
        (dict(mode="every_k", k=0), "k"),
        (dict(mode="kl_threshold"), "kappa"),
        (dict(mode="kl_threshold", kappa=-1.0), "kappa"),
        (dict(mode="kl_threshold", kappa=0.1, kl_window=0), "kl_window"),
    ],
)
def test_bad_arguments_name_themselves(kwargs, arg):
    with pytest.raises(ValueError, match=rf"^{arg}:"):
        ReferenceSchedule(**kwargs)


def test_bad_step_kl_and_mismatched_state():
    s = ReferenceSchedule("kl_threshold", kappa=0.1)
    with pytest.raises(ValueError, match=r"^step_kl:"):
        s.observe(float("nan"))
    with pytest.raises(ValueError, match=r"^state:"):
        ReferenceSchedule("every_k", k=2).load_state_dict(ReferenceSchedule("every_k", k=3).state_dict())
