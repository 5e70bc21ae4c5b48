"""``python -m rpg_openrlhf.nodecheck``."""

from rpg_openrlhf.nodecheck.cli import main

main()
