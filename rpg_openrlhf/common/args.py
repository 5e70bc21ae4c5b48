"""Reading and writing OpenRLHF's argument namespaces, flat or nested.

argparse returns a flat namespace (``getattr(args, "rpg.loss")``); ``openrlhf.utils.config.hierarchize``
turns it into nested ones (``args.rpg.loss``). Every check that runs on both takes its values here.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

#: The flag that turns RPG on (its declaration: rpg_openrlhf.plugin.settings.LOSS). The one place
#: its name is written: every "is RPG on?" asks :func:`rpg_enabled`.
RPG_LOSS = "rpg.loss"


def rpg_enabled(args: Any) -> bool:
    """RPG is on when ``--rpg.loss`` is given (flat or nested ``args``)."""
    return get(args, RPG_LOSS) is not None


def has(args: Any, key: str) -> bool:
    """Whether ``args`` holds ``key`` (flat or nested)."""
    if key in vars(args):
        return True
    node = args
    for part in key.split("."):
        if not hasattr(node, part):
            return False
        node = getattr(node, part)
    return True


def get(args: Any, key: str, default: Any = None) -> Any:
    """``args[key]`` for a flat (``"rpg.loss"`` attribute) or nested namespace."""
    flat = vars(args)
    if key in flat:
        return flat[key]
    node = args
    for part in key.split("."):
        if not hasattr(node, part):
            return default
        node = getattr(node, part)
    return node


def set_value(args: Any, key: str, value: Any) -> None:
    """Set ``args[key]`` in a flat or nested namespace (intermediate namespaces are created)."""
    if key in vars(args):
        setattr(args, key, value)
        return
    parts = key.split(".")
    node = args
    for part in parts[:-1]:
        if not hasattr(node, part):
            setattr(node, part, SimpleNamespace())
        node = getattr(node, part)
    setattr(node, parts[-1], value)
