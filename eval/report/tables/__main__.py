"""``python -m rpg_eval.report.tables``: the same as ``rpg-eval table``."""

import sys

from .cli import main

sys.exit(main())
