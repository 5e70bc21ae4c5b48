"""Run OpenRLHF's ``train_ppo_ray`` as it is, with flags added to its parser and a hook before its
``train(args)``: how ``rpg-train`` and ``python -m rpg_openrlhf.cpu_backend`` start OpenRLHF.

:meth:`TrainPPORay.run` runs the module's own ``__main__`` code (as ``python -m`` does) with its
imports of packages outside the standard library (Ray, OpenRLHF's trainer, DeepSpeed, vLLM: about 10
CPU-s) deferred until training really starts (:class:`DeferredMain`), so ``--help``, a usage error and
``--dry-run`` build and check OpenRLHF's very parser without them (tests/test_train_ppo_ray_source.py).

1. ``ArgumentParser.parse_args`` is wrapped (seam ``parse_args``) so that the module's parser also
   gets the caller's flags; right after parsing (flat namespace) the caller's ``after_parse`` runs;
2. after OpenRLHF's own argument checks, its ``train(args)`` is replaced (seam ``train``) by the
   caller's ``before_train(args, main_globals)``; unless that returns False (``--dry-run``), the
   deferred imports run, the names in :data:`REBIND` are re-read (so class swaps made by the hook
   reach OpenRLHF's ``train``) and OpenRLHF's ``train`` runs.

A parse error, a ``ValueError`` from either hook and one of OpenRLHF's own argument checks (asserts)
are one line ``PROG: error: ...``, exit status 2; long flags are never abbreviated.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rpg_openrlhf.common.cliutil import DEBUG_ENV, describe, pop_debug, quiet_known_warnings
from rpg_openrlhf.common.deferred_main import DeferredMain
from rpg_openrlhf.common.seam import swapped
from rpg_openrlhf.common.vllm_cpu import engine_failure_in

OPENRLHF_MODULE = "openrlhf.cli.train_ppo_ray"

#: Names train_ppo_ray binds at import time -> (module, attribute) they come from. They are
#: re-read after the caller's hook and the deferred imports so that class swaps made there reach
#: OpenRLHF's ``train``.
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


def usage_error(prog: str, exc: BaseException | str) -> None:
    """Report a configuration error like argparse does: one line, exit status 2."""
    print(f"{prog}: error: {str(exc).removeprefix(f'{prog}: ')}", file=sys.stderr)
    raise SystemExit(2) from (exc if isinstance(exc, BaseException) else None)


@dataclass
class TrainPPORay:
    """One run of train_ppo_ray with a caller's flags and hooks.

    ``add_arguments(parser)`` adds the caller's flags; ``after_parse(flat_ns)`` checks them right
    after parsing and returns log lines (ValueError: a usage error); ``before_train(args,
    main_globals)`` runs in place of OpenRLHF's ``train(args)`` and returns whether to go on into it.
    """

    prog: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    before_train: Callable[[Any, dict[str, Any]], bool]
    after_parse: Callable[[argparse.Namespace], list[str]] | None = None
    notes: list[str] = field(default_factory=list)
    parsed: bool = False
    train_called: bool = False
    main_globals: dict[str, Any] | None = None
    source: DeferredMain | None = None

    def parse_args(
        self, original: Callable[..., Any], parser: argparse.ArgumentParser, args: Any, namespace: Any
    ) -> Any:
        # OpenRLHF's parser: the one its __main__ block bound to ``parser`` (any other is left alone)
        if self.parsed or self.main_globals is None or self.main_globals.get("parser") is not parser:
            return original(parser, args, namespace)
        self.parsed = True
        self.add_arguments(parser)
        # Named as the command the user ran; a parse error is one line (not OpenRLHF's ~170-line
        # usage block); no prefix matching: a mistyped flag (--rpg.los) must not be another flag.
        parser.prog = self.prog
        parser.allow_abbrev = False
        parser.error = lambda message: usage_error(self.prog, message)  # type: ignore[method-assign]
        ns = original(parser, args, namespace)
        if self.after_parse is not None:  # before OpenRLHF's processing, which fails with raw tracebacks
            try:
                self.notes = self.after_parse(ns)
            except ValueError as exc:
                usage_error(self.prog, exc)
        # The caller is train_ppo_ray's __main__ block: swap its train() for ours (seam ``train``).
        original_train = self.main_globals["train"]
        self.main_globals["train"] = lambda hargs: self.train(hargs, original_train)
        return ns

    def train(self, args: Any, original_train: Callable[[Any], Any]) -> Any:
        """Everything between OpenRLHF's argument checks and its ``train(args)``."""
        self.train_called = True
        assert self.main_globals is not None and self.source is not None
        if not self.before_train(args, self.main_globals):
            return None
        self.source.import_deferred(self.main_globals)  # Ray, OpenRLHF's trainer: training starts
        self._rebind()
        return original_train(args)

    def _rebind(self) -> None:
        assert self.main_globals is not None
        for name, (module_name, attr) in REBIND.items():
            if name in self.main_globals:
                self.main_globals[name] = getattr(importlib.import_module(module_name), attr)

    def run(self, argv: Sequence[str]) -> None:
        """Run train_ppo_ray's ``__main__`` block with ``argv`` (seams ``parse_args`` and ``train``), its
        module-level imports of Ray and OpenRLHF's trainer deferred to :meth:`train`."""
        original = argparse.ArgumentParser.parse_args
        quiet_known_warnings()  # torch's pynvml warning would precede every message of the run

        def parse_args(parser: argparse.ArgumentParser, args: Any = None, namespace: Any = None) -> Any:
            return self.parse_args(original, parser, args, namespace)

        argv = list(argv)
        debug = pop_debug(argv)  # --debug anywhere, or RPG_DEBUG=1: tracebacks instead of one line
        self.source = DeferredMain.load(OPENRLHF_MODULE)
        module = self.source.new_module()
        self.main_globals = vars(module)
        with swapped(argparse.ArgumentParser, parse_args=parse_args):
            try:
                self.source.run(module, argv)
            except AssertionError as exc:
                if self.train_called or not self.parsed or not str(exc):
                    raise
                usage_error(self.prog, exc)  # one of OpenRLHF's own argument checks (they are asserts)
            except Exception as exc:
                # A rollout engine that cannot run on this machine (head size, KV cache, a checkpoint
                # vLLM cannot load): one line naming the model and what to change.
                failure = None if debug else engine_failure_in(exc)
                if failure is None:
                    raise
                usage_error(self.prog, f"{describe(failure)} (--debug or {DEBUG_ENV}=1 for the traceback)")
