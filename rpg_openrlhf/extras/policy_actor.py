"""Mixins in front of the policy actor class a run uses (OpenRLHF's ``PolicyModelActor`` or the RPG one)."""

from __future__ import annotations

from types import ModuleType


def prepend_mixin(module: ModuleType, mixin: type) -> None:
    """``module.PolicyModelActor`` becomes ``mixin`` + its current class (a Ray actor with one GPU, as
    OpenRLHF declares it); nothing if that class already has the mixin."""
    import ray

    cls = module.PolicyModelActor.__ray_actor_class__
    if not issubclass(cls, mixin):
        wrapped = type(cls.__name__, (mixin, cls), {"__doc__": cls.__doc__})
        module.PolicyModelActor = ray.remote(num_gpus=1)(wrapped)
