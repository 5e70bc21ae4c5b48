"""The CPU backend's own flags (added to OpenRLHF's train_ppo_ray parser).

``--cpu.trust_remote_code``: let the rollout engines run code shipped with the checkpoint
(transformers' ``trust_remote_code``; off by default; OpenRLHF's GPU engines always trust it).
The old spelling ``--rpg.trust_remote_code`` is an alias.
"""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--cpu.*`` to ``parser``."""
    group = parser.add_argument_group("CPU backend (stock OpenRLHF without a GPU)")
    group.add_argument(
        "--cpu.trust_remote_code",
        "--rpg.trust_remote_code",
        dest="cpu.trust_remote_code",
        action="store_true",
        default=False,
        help="let the CPU backend's rollout engines run code shipped with the checkpoint "
        "(transformers' trust_remote_code; off by default). OpenRLHF's GPU engines always trust it",
    )
