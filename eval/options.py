"""Values of the command line every rpg-eval command reads alike: ``KEY=VALUE`` lists
(``--label RUN=LABEL``, ``--data NAME=FILE``, ``--model-arg KEY=VALUE``)."""

from __future__ import annotations

from collections.abc import Sequence


def key_values(items: Sequence[str] | None, flag: str, form: str = "KEY=VALUE") -> dict[str, str]:
    """``KEY=VALUE`` items as a mapping (keys and values stripped of spaces); ValueError naming ``flag``
    for an item without "=" or a key given twice."""
    out: dict[str, str] = {}
    for item in items or []:
        if "=" not in item:
            raise ValueError(f"{flag}: expected {form}, got {item!r}")
        key, value = (x.strip() for x in item.split("=", 1))
        if key in out:
            raise ValueError(f"{flag} {key}: given twice ({out[key]!r} and {value!r}); give it once")
        out[key] = value
    return out
