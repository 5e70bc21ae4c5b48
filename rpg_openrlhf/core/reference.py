"""When to refresh the reference policy pi_ref (the paper's iterative reference scheme)."""

from __future__ import annotations

import math
from typing import Any

REFERENCE_MODES = ("initial", "rollout", "every_k", "kl_threshold")


class ReferenceSchedule:
    """Refresh schedule for pi_ref <- pi_theta (observe() after each optimizer step). initial: never;
    rollout: pi_ref = pi_old (the paper's code: ref_logp=None); every_k: every k steps; kl_threshold:
    when the mean token KL of the last kl_window steps since the last refresh (None: all) exceeds kappa."""

    def __init__(self, mode: str = "rollout", k: int | None = None, kappa: float | None = None,
                 kl_window: int | None = None) -> None:  # fmt: skip
        if mode not in REFERENCE_MODES:
            raise ValueError(f"mode: unknown {mode!r}, expected one of {REFERENCE_MODES}")
        if mode == "every_k" and not (isinstance(k, int) and k >= 1):
            raise ValueError(f"k: mode 'every_k' needs a positive int, got {k!r}")
        if mode == "kl_threshold" and not (isinstance(kappa, (int, float)) and kappa > 0 and math.isfinite(kappa)):  # fmt: skip
            raise ValueError(f"kappa: mode 'kl_threshold' needs a finite value > 0, got {kappa!r}")
        if kl_window is not None and not (isinstance(kl_window, int) and kl_window >= 1):
            raise ValueError(f"kl_window: must be a positive int or None, got {kl_window!r}")
        self.mode, self.k, self.kappa, self.kl_window = mode, k, kappa, kl_window
        self.step = self.last_refresh = 0
        self.kl_history: list[float] = []
        self.refreshes: list[int] = []

    @property
    def uses_old_policy(self) -> bool:
        """pi_ref = pi_old (mode 'rollout'): no reference model."""
        return self.mode == "rollout"

    @property
    def running_kl(self) -> float:
        """Mean token KL over the current window (nan before the first observation)."""
        return sum(self.kl_history) / len(self.kl_history) if self.kl_history else math.nan

    def observe(self, step_kl: float | None = None) -> bool:
        """Record one optimizer step (with its mean token KL); True means refresh pi_ref now."""
        self.step += 1
        if self.mode == "every_k":
            refresh = self.step - self.last_refresh >= self.k
        elif self.mode == "kl_threshold":
            if step_kl is None or not math.isfinite(step_kl):
                raise ValueError(f"step_kl: mode 'kl_threshold' needs a finite KL, got {step_kl!r}")
            self.kl_history.append(float(step_kl))
            if self.kl_window is not None:
                del self.kl_history[: -self.kl_window]
            refresh = self.running_kl > self.kappa
        else:
            refresh = False
        if refresh:
            self.refreshes.append(self.step)
            self.last_refresh = self.step
            self.kl_history = []
        return refresh

    def state_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "k": self.k, "kappa": self.kappa, "kl_window": self.kl_window,
                "step": self.step, "last_refresh": self.last_refresh,
                "kl_history": list(self.kl_history), "refreshes": list(self.refreshes)}  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key in ("mode", "k", "kappa", "kl_window"):
            if state.get(key) != getattr(self, key):
                raise ValueError(f"state: {key}={state.get(key)!r} does not match this schedule's {getattr(self, key)!r}")  # fmt: skip
        self.step, self.last_refresh = int(state["step"]), int(state["last_refresh"])
        self.kl_history, self.refreshes = list(state["kl_history"]), list(state["refreshes"])
