"""Which versions of the third-party packages this project's patches were checked against.

Every entry point calls :func:`check` before anything runs: ``rpg-train`` and the CPU backend with
OpenRLHF, DeepSpeed and vLLM (``rpg_openrlhf.common.seam.CHECKED_VERSIONS``), ``rpg-eval`` with
lm-eval and vLLM (``rpg_eval.run.patches.CHECKED_VERSIONS``). A version outside the checked set stops the run with one message, unless
``RPG_ALLOW_UNCHECKED_VERSIONS=1``: then it is a warning. A package that is not installed is not
checked (the stand-ins, or the code path that needs it, report that). The patch table and what to
re-check on an upgrade: docs/contracts.md, "The seam".
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from importlib import metadata

#: Set to 1 to run with versions outside the checked set (a warning instead of an error).
ALLOW_ENV = "RPG_ALLOW_UNCHECKED_VERSIONS"


class UncheckedVersionError(ValueError):
    """An installed package's version is outside the set this project was checked against."""


def installed_version(distribution: str) -> str | None:
    """The installed version of ``distribution`` or None."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def mismatches(checked: Mapping[str, tuple[str, ...]]) -> list[str]:
    """One line per installed package whose version is not in ``checked``."""
    out = []
    for dist, versions in checked.items():
        found = installed_version(dist)
        if found is not None and found.split("+", 1)[0] not in versions:  # the public version (no +local)
            out.append(f"{dist} {found} is installed; checked: {', '.join(versions)}")
    return out


def check(checked: Mapping[str, tuple[str, ...]], tool: str) -> list[str]:
    """For ``tool`` (named in the warning): raise :class:`UncheckedVersionError` (one message naming every mismatch) or, with
    ``RPG_ALLOW_UNCHECKED_VERSIONS=1``, return the warnings to print."""
    found = mismatches(checked)
    if not found:
        return []
    what = "; ".join(found)
    if os.environ.get(ALLOW_ENV, "") == "1":
        return [f"WARNING: {tool} with unchecked versions ({what}); running anyway because {ALLOW_ENV}=1"]
    raise UncheckedVersionError(
        f"{what}. This project patches these packages at named places written against the "
        f"checked versions (docs/contracts.md, 'The seam'); install a checked version, or set "
        f"{ALLOW_ENV}=1 to run anyway and re-check the patches (tests/test_seam.py)"
    )
