"""``python -m rpg_openrlhf.cpu_backend <train_ppo_ray flags>``: stock OpenRLHF on CPU, nothing else.

Every flag of OpenRLHF's ``train_ppo_ray`` works as there (GRPO, DAPO, REINFORCE++ ...), plus the
CPU backend's ``--cpu.*`` and the log-prob path's ``--logprobs.chunked`` / ``--logprobs.full``
(OpenRLHF's full logits by default here). Settings CPU cannot run are refused with one line naming the flag.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from rpg_openrlhf.common import logprobs_path
from rpg_openrlhf.common.seam import CHECKED_VERSIONS
from rpg_openrlhf.common.train_ppo_ray import TrainPPORay, usage_error
from rpg_openrlhf.common.versions import UncheckedVersionError, check
from rpg_openrlhf.cpu_backend import driver, flags
from rpg_openrlhf.cpu_backend.standins import provide_stand_ins

PROG = "python -m rpg_openrlhf.cpu_backend"


def before_train(args: Any, main_globals: dict[str, Any]) -> bool:
    try:
        for note in driver.prepare_args(args):
            print(f"{driver.LOG_PREFIX} {note}")
        print(f"{driver.LOG_PREFIX} {logprobs_path.resolve(args, rpg_run=False)[1]}")
    except ValueError as exc:
        usage_error(PROG, exc)
    driver.start(args, main_globals)
    logprobs_path.enable(args)  # --logprobs.chunked: the seam's stage "logprobs"
    return True


def add_arguments(parser: Any) -> None:
    """The CPU backend's flags and the log-prob path's (``--logprobs.chunked`` / ``--logprobs.full``)."""
    flags.add_arguments(parser)
    logprobs_path.add_arguments(parser)


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        for warning in check(CHECKED_VERSIONS, PROG):
            print(f"{driver.LOG_PREFIX} {warning}", file=sys.stderr)
    except UncheckedVersionError as exc:
        usage_error(PROG, exc)
    provide_stand_ins()  # train_ppo_ray imports vllm / flash_attn at module level
    TrainPPORay(PROG, add_arguments, before_train).run(argv)


if __name__ == "__main__":
    main()
