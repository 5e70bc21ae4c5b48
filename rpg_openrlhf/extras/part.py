"""A named part of a trainer (the step budget, the checkpoint store): one per trainer, made from its
args on first use."""

from __future__ import annotations

from typing import Any, TypeVar

P = TypeVar("P", bound="TrainerPart")


class TrainerPart:
    def __init__(self, args: Any) -> None:
        self.args = args

    @classmethod
    def of(cls: type[P], trainer: Any) -> P:
        """The trainer's part, made on first use (tests build trainers without ``__init__``)."""
        key = f"_rpg_part_{cls.__name__}"
        part = trainer.__dict__.get(key)
        if part is None:
            part = trainer.__dict__[key] = cls(trainer.args)
        return part
