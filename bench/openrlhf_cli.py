"""OpenRLHF's own ``python -m openrlhf.cli.train_ppo_ray ARGS`` on a CPU machine: the yardstick for
``rpg-train --help`` and a usage error (docs/training.md). OpenRLHF imports flash_attn at import time,
absent here: its plain-torch stand-in is provided first (rpg_openrlhf.cpu_backend.standins), nothing else.

    farm-bench -n 5 --timeout 400 --vs '.venv/bin/python bench/openrlhf_cli.py --help' -- .venv/bin/rpg-train --help
"""

import runpy
import sys

from rpg_openrlhf.cpu_backend.standins import provide_stand_ins

provide_stand_ins(("flash_attn",))
sys.argv = ["train_ppo_ray", *sys.argv[1:]]
runpy.run_module("openrlhf.cli.train_ppo_ray", run_name="__main__")
