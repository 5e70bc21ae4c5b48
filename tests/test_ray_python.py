"""How the CPU backend starts Ray and its rendezvous (``common/ray_python.py``, ``cpu_backend``).

* Ray workers start from a venv whose path has a space: Ray runs ``bash -c "exec <python> ..."`` for a
  worker with a runtime environment, the path unquoted; without ``worker_python()`` the worker below
  never registers and ``ray.get`` times out.
* The local Ray is started again when the raylet missed Ray's fixed 30 s to register (a loaded
  machine: seen in a suite run beside other work), and only then.
* Rendezvous ports come from outside the kernel's ephemeral range (``cpu_backend/ports.py``): OpenRLHF
  binds port 0, closes, and its rendezvous binds the port later; port 0 and every outgoing connection
  are served from ``ip_local_port_range``, so another process can be handed that port in between
  (EADDRINUSE; seen once in the suite). The patched picks (seams ``launcher_port`` /
  ``sync_group_port``) never come from that range: checked on OpenRLHF's own code in
  tests/test_cpu_backend.py.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import ray

from rpg_openrlhf.cpu_backend import driver, ports

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


TIMEOUT = Exception("The current node timed out during startup. This could happen because ...")


@pytest.fixture
def fake_ray(monkeypatch):
    calls = {"init": 0, "shutdown": 0}
    outcomes: list[Exception | None] = []

    def init(**kwargs):
        calls["init"] += 1
        outcome = outcomes.pop(0)
        if outcome is not None:
            raise outcome

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(ray, "shutdown", lambda: calls.__setitem__("shutdown", calls["shutdown"] + 1))
    monkeypatch.setattr(driver, "logical_gpus_needed", lambda args: 2)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    return calls, outcomes


ARGS = SimpleNamespace(vllm=SimpleNamespace(num_engines=1))


def test_a_start_timeout_is_retried_three_times_and_other_errors_propagate(fake_ray, capsys) -> None:
    calls, outcomes = fake_ray
    outcomes += [TIMEOUT, None]
    driver._start_ray(ARGS, {"env_vars": {}})
    assert calls == {"init": 2, "shutdown": 1} and "starting it again (2/3)" in capsys.readouterr().out
    outcomes += [TIMEOUT] * 3
    with pytest.raises(Exception, match="timed out during startup"):
        driver._start_ray(ARGS, {"env_vars": {}})
    assert calls == {"init": 5, "shutdown": 3}
    outcomes += [ValueError("bad argument")]
    with pytest.raises(ValueError):
        driver._start_ray(ARGS, {"env_vars": {}})
    assert calls == {"init": 6, "shutdown": 3}


def test_stretches_leave_out_the_ephemeral_range_and_rays_worker_ports(tmp_path: Path) -> None:
    path = tmp_path / "ip_local_port_range"
    path.write_text("40000\t50000\n")
    assert ports.ephemeral_range(path) == (40000, 50000)
    assert ports.ephemeral_range(tmp_path / "absent") == (32768, 60999)  # Linux's default
    path.write_text("garbage\n")
    assert ports.ephemeral_range(path) == (32768, 60999)
    assert ports.outside_ephemeral(32768, 60999) == [range(20000, 32768), range(61000, 65536)]
    assert ports.outside_ephemeral(1024, 65535) == []  # all ephemeral: the kernel's choice is the fallback
    assert ports.outside_ephemeral(20500, 64999) == []  # stretches under 1,000 ports are not used
    assert ports.outside_ephemeral(10000, 60999) == [range(61000, 65536)]


def test_taken_ports_are_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        picks = iter([busy, busy, 20001])
        monkeypatch.setattr(ports, "outside_ephemeral", lambda low, high: [range(busy, busy + 1)])

        class Pick:
            def choice(self, seq):  # noqa: ANN001, ANN201
                return seq[0]

            def randrange(self, start: int, stop: int) -> int:
                return next(picks)

        monkeypatch.setattr(ports.random, "SystemRandom", Pick)
        assert ports.rendezvous_port() == 20001
