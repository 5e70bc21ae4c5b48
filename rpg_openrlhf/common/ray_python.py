"""Ray workers from a Python whose path has a space in it.

Ray starts a worker that has a runtime environment (every worker here: the run's variables) through
``bash -c "exec <python> ..."``, with the interpreter's path unquoted
(``ray/_private/runtime_env/context.py``, ``RuntimeEnvContext.exec_worker``): under ``/home/me/my
runs/.venv`` bash looks for ``/home/me/my`` and no worker ever registers. ``py_executable`` is a shell
fragment there, so a quoted path is what it expects.
"""

from __future__ import annotations

import shlex
import sys
from typing import Any


def worker_python(executable: str | None = None) -> dict[str, Any]:
    """The ``runtime_env`` entry that makes Ray start workers with this interpreter from any path
    (empty where the path has no whitespace: Ray's own default then)."""
    path = sys.executable if executable is None else executable
    return {"py_executable": shlex.quote(path)} if any(c.isspace() for c in path) else {}
