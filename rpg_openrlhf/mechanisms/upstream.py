"""The frameworks' own code, as installed: where it is, which version, and its functions loaded.

OpenRLHF 0.11.2 is the training stack itself. TRL and verl are installed by `make setup`
(requirements/conformance.txt) with --no-deps into a directory of their own, CONFORMANCE_DIR, which only
the conformance puts on sys.path (appended: the stack's own packages keep precedence), so that their
metadata pins (verl 0.9.1: transformers < 5.11; the stack pins 5.15) never touch the training stack.

openrlhf.models' package __init__ imports flash_attn (absent on CPU), so OpenRLHF's loss and KL
functions are loaded by file path under a bare `openrlhf.models` package, as OpenRLHF's own tests do;
its experience maker's module imports the Ray launcher (and through it the models), which a bare
module stands in for while it loads. Nothing else of those modules is used.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
import types
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from types import SimpleNamespace

#: where `make setup` installs the frameworks the conformance runs (requirements/conformance.txt);
#: RPG_CONFORMANCE_DIR names another
CONFORMANCE_DIR = Path(os.environ.get("RPG_CONFORMANCE_DIR") or Path(sys.prefix) / "conformance")
#: framework -> its distribution name on PyPI
DISTRIBUTIONS = {"OpenRLHF": "openrlhf", "TRL": "trl", "verl": "verl"}


def use_conformance_dir() -> None:
    """Append CONFORMANCE_DIR to sys.path (once), when it exists."""
    if CONFORMANCE_DIR.is_dir() and str(CONFORMANCE_DIR) not in sys.path:
        sys.path.append(str(CONFORMANCE_DIR))


def version_of(framework: str) -> str | None:
    """The installed version of a framework (the stack's or the conformance directory's), or None."""
    use_conformance_dir()
    try:
        return metadata.version(DISTRIBUTIONS[framework])
    except metadata.PackageNotFoundError:
        return None


@contextlib.contextmanager
def _bare_packages(packages: dict[str, Path], stand_ins: dict[str, types.ModuleType]) -> Iterator[None]:
    """Register bare packages (name -> its folder) and stand-in modules in sys.modules for a while;
    afterwards every openrlhf module this registered is removed again (the loaded functions keep their
    globals), so a later plain `import openrlhf.models` in this process is not served a bare one."""
    before = {k: v for k, v in sys.modules.items() if k.startswith("openrlhf")}
    for name, folder in packages.items():
        pkg = types.ModuleType(name)
        pkg.__path__ = [str(folder)]
        sys.modules[name] = pkg
    sys.modules.update(stand_ins)
    try:
        yield
    finally:
        for k in [k for k in sys.modules if k.startswith("openrlhf")]:
            del sys.modules[k]
        sys.modules.update(before)


def _load_file(name: str, path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def openrlhf_root() -> Path:
    spec = importlib.util.find_spec("openrlhf")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("openrlhf is not installed in this environment")
    return Path(list(spec.submodule_search_locations)[0])


def openrlhf_loss_modules() -> tuple[types.ModuleType, types.ModuleType]:
    """(openrlhf.models.utils, openrlhf.models.loss), loaded by file path; they stay registered
    under a bare openrlhf.models (torch.compile looks globals up by module name: bench/loss_cost.py)."""
    root = openrlhf_root()
    import openrlhf  # noqa: F401  (the top-level package imports without flash_attn)

    pkg = types.ModuleType("openrlhf.models")
    pkg.__path__ = [str(root / "models")]
    sys.modules["openrlhf.models"] = pkg
    return tuple(_load_file(f"openrlhf.models.{n}", root / "models" / f"{n}.py") for n in ("utils", "loss"))


def openrlhf() -> SimpleNamespace:
    """OpenRLHF's compute_approx_kl, PolicyLoss, aggregate_loss, FixedKLController, Experience and
    RemoteExperienceMaker (its compute_advantages_and_returns: the KL in the reward), as installed."""
    root = openrlhf_root()
    launcher = types.ModuleType("openrlhf.trainer.ray.launcher")
    launcher.RayActorGroup = object  # a type annotation there; the experience maker needs no Ray here
    bare = {"openrlhf.models": root / "models", "openrlhf.trainer.ray": root / "trainer" / "ray"}
    with _bare_packages(bare, {launcher.__name__: launcher}):
        utils = _load_file("openrlhf.models.utils", root / "models" / "utils.py")
        loss = _load_file("openrlhf.models.loss", root / "models" / "loss.py")
        from openrlhf.trainer.ppo_utils.experience import Experience
        from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker
        from openrlhf.trainer.ppo_utils.kl_controller import FixedKLController
    return SimpleNamespace(
        compute_approx_kl=utils.compute_approx_kl,
        PolicyLoss=loss.PolicyLoss,
        aggregate_loss=loss.aggregate_loss,
        FixedKLController=FixedKLController,
        Experience=Experience,
        RemoteExperienceMaker=RemoteExperienceMaker,
    )


def verl() -> SimpleNamespace:
    """verl's actor loss (verl.workers.utils.losses.ppo_loss: compute_policy_loss_vanilla + kl_penalty
    + agg_loss), its actor config, TensorDict and its tensordict helpers, as installed."""
    use_conformance_dir()
    from tensordict import TensorDict
    from verl.utils import tensordict_utils
    from verl.workers.config import FSDPActorConfig
    from verl.workers.utils.losses import ppo_loss

    return SimpleNamespace(ppo_loss=ppo_loss, ActorConfig=FSDPActorConfig, TensorDict=TensorDict,
                           tu=tensordict_utils)  # fmt: skip


def trl() -> SimpleNamespace:
    """TRL's GRPOConfig and GRPOTrainer, as installed."""
    use_conformance_dir()
    from trl import GRPOConfig, GRPOTrainer

    return SimpleNamespace(GRPOConfig=GRPOConfig, GRPOTrainer=GRPOTrainer)
