"""The RPG reference weights beside a checkpoint: ``<ckpt.path>/_rpg_reference/<tag>.pt`` (:class:`ReferenceFiles`).

OpenRLHF's checkpoint holds the actor (and its ``client_states``) only; the reference actors are rebuilt
from the initial model on start. After a refresh the reference is therefore written beside the
checkpoint, before the checkpoint that names it (a checkpoint never points at a missing file); while
it has not changed since, the previous file is hard-linked instead of gathered again; files of tags
OpenRLHF has rotated out are pruned. Plain files and ``torch.save``: the plug-in supplies the weights.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import Any

from rpg_openrlhf.common.atomic import atomic_write

#: Under ``--ckpt.path``: the reference weights of each checkpoint (after a refresh).
REFERENCE_DIR = "_rpg_reference"


class ReferenceFiles:
    """The reference files of the run at ``ckpt_path``; remembers the one this process wrote or loaded last."""

    def __init__(self, ckpt_path: str) -> None:
        self.ckpt_path = ckpt_path
        self.dir = os.path.join(ckpt_path, REFERENCE_DIR)
        self.actor_dir = os.path.join(ckpt_path, "_actor")
        #: (path, refresh step) of the file written or loaded last
        self.last: tuple[str, int] | None = None

    def write(self, tag: str, refresh_step: int, state_dict: Callable[[], dict]) -> str:
        """``<tag>.pt`` holding the reference of refresh ``refresh_step``, replaced atomically; returns its path.

        Between refreshes the reference does not change: the file written last is hard-linked instead
        of calling ``state_dict()`` (a gather) again."""
        import torch

        path = os.path.join(self.dir, f"{tag}.pt")
        os.makedirs(self.dir, exist_ok=True)
        previous = self.last
        if not (previous is not None and previous[1] == refresh_step and self._link(previous[0], path)):
            with atomic_write(path, "wb", tmp=f"{tag}.pt.tmp") as f:  # old file or new, never half
                torch.save({"refresh_step": refresh_step, "state_dict": state_dict()}, f)
        self.last = (path, refresh_step)
        return path

    def _link(self, previous: str, path: str) -> bool:
        """Hard-link the file written last to ``path`` (atomically); False when it cannot (gone, no hard
        links on this filesystem): the caller writes anew."""
        if os.path.abspath(previous) == os.path.abspath(path):
            return os.path.isfile(path)
        tmp = path + ".tmp"
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            os.link(previous, tmp, follow_symlinks=False)
            os.replace(tmp, path)
        except OSError:
            return False
        return True

    def prune(self, keep: str) -> None:
        """Remove the files of checkpoints that OpenRLHF has rotated out (keeps the file named ``keep``)."""
        if not os.path.isdir(self.actor_dir) or not os.path.isdir(self.dir):
            return  # actor checkpoints on another node's disk: nothing to compare with, keep all
        tags = set(os.listdir(self.actor_dir))
        for name in os.listdir(self.dir):
            if name != keep and name.endswith((".pt", ".pt.tmp")) and name.split(".pt")[0] not in tags:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(os.path.join(self.dir, name))

    def path(self, name: str | None) -> str | None:
        """Where the file a checkpoint names is (None when it names none)."""
        return os.path.join(self.dir, name) if name else None

    def load(self, path: str) -> dict[str, Any]:
        """``{"refresh_step", "state_dict"}`` of a file (remembered for the next link)."""
        import torch

        payload = torch.load(path, map_location="cpu", weights_only=True)
        self.last = (path, int(payload["refresh_step"]))
        return payload
