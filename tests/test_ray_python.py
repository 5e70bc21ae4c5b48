"""Ray workers start from a venv whose path has a space (``common/ray_python.py``).

Ray runs ``bash -c "exec <python> ..."`` for a worker with a runtime environment, the path unquoted;
without ``worker_python()`` the worker below never registers and ``ray.get`` times out.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from rpg_openrlhf.common.ray_python import worker_python

REPO = Path(__file__).resolve().parents[1]

PROBE = """
import json, os, sys
import ray
from rpg_openrlhf.common.ray_python import worker_python

extra = worker_python() if sys.argv[1] == "quoted" else {}
for attempt in range(3):  # Ray allows its raylet a fixed 30 s to register: a loaded machine can need more
    try:
        ray.init(address="local", num_cpus=1, include_dashboard=False, logging_level="ERROR",
                 runtime_env={"env_vars": {"RPG_PROBE": "from the driver"}, **extra})
        break
    except Exception as exc:
        if "timed out during startup" not in str(exc) or attempt == 2:
            raise

@ray.remote
def where():
    return os.environ.get("RPG_PROBE"), sys.executable

print(json.dumps(ray.get(where.remote(), timeout=float(sys.argv[2]))))
ray.shutdown()
"""


def test_only_a_path_with_whitespace_is_quoted() -> None:
    assert worker_python("/home/me/my runs/.venv/bin/python") == {
        "py_executable": "'/home/me/my runs/.venv/bin/python'"
    }
    assert worker_python("/home/me/runs/.venv/bin/python") == {}


def test_a_worker_starts_from_a_venv_under_a_path_with_a_space(tmp_path: Path) -> None:
    venv = tmp_path / "venv with space"
    venv.symlink_to(Path(sys.prefix), target_is_directory=True)  # the same venv, seen through the path
    python = venv / "bin" / "python"
    proc = subprocess.run(
        [str(python), "-c", PROBE, "quoted", "300"],
        cwd=REPO, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    probe, executable = json.loads(proc.stdout.strip().splitlines()[-1])
    assert probe == "from the driver" and executable == str(python)
