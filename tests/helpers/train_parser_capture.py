"""Print OpenRLHF's train_ppo_ray parser as JSON (help text, option strings, defaults), built one of
two ways, then exit: ``installed`` runs the module as installed (``python -m``: every module-level
import, flash_attn's stand-in where it is not installed); ``deferred`` runs it the way rpg-train does
(rpg_openrlhf.common.deferred_main: the imports outside the standard library left out). The JSON's
``heavy`` lists the modules of Ray, DeepSpeed, vLLM and OpenRLHF's trainer loaded by then."""

from __future__ import annotations

import argparse
import json
import re
import runpy
import sys

MODULE = "openrlhf.cli.train_ppo_ray"
HEAVY_ROOTS = ("ray", "deepspeed", "vllm")
#: --logger.wandb.run_name defaults to ``ppo_`` and the clock's ``%m%dT%H:%M``: two captures a minute
#: boundary apart differ there (CI, stop 46), so both ways print the clock's reading as this mark.
CLOCK = re.compile(r"ppo_\d{4}T\d{2}:\d{2}")
CLOCK_MARK = "ppo_<%m%dT%H:%M>"


class Captured(Exception):
    """Raised from parse_args with what the parser holds (nothing after parsing runs)."""


def capture(parser: argparse.ArgumentParser, args: object = None, namespace: object = None) -> None:
    parser.prog = "train_ppo_ray"  # both ways name the module's file; one name for the comparison
    defaults = vars(parser.parse_known_args([])[0])
    raise Captured(
        {
            "help": CLOCK.sub(CLOCK_MARK, parser.format_help()),
            "options": sorted(s for action in parser._actions for s in action.option_strings),
            "defaults": {key: CLOCK.sub(CLOCK_MARK, repr(value)) for key, value in defaults.items()},
        }
    )


def heavy_modules() -> list[str]:
    return sorted(
        m for m in sys.modules if m.split(".")[0] in HEAVY_ROOTS or m.startswith("openrlhf.trainer")
    )


def main(way: str) -> None:
    argparse.ArgumentParser.parse_args = capture  # type: ignore[method-assign]
    try:
        if way == "installed":
            from rpg_openrlhf.cpu_backend.standins import provide_stand_ins

            provide_stand_ins()
            runpy.run_module(MODULE, run_name="__main__", alter_sys=True)
        else:
            from rpg_openrlhf.common.deferred_main import DeferredMain

            source = DeferredMain.load(MODULE)
            source.run(source.new_module(), [])
    except Captured as found:
        print(json.dumps({**found.args[0], "heavy": heavy_modules()}))
        return
    raise SystemExit(f"{MODULE} never called parse_args")


if __name__ == "__main__":
    main(sys.argv[1])
