"""``python -m rpg_openrlhf.demo``: the same as ``rpg-demo``."""

from rpg_openrlhf.demo.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
