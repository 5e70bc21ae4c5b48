"""What a careless user hit (issue 49), each fixed inside the threat model (docs/contracts.md):

* a kill anywhere leaves no process behind: SIGTERM or SIGKILL to rpg-demo ends the stage it runs
  (its worker runs in a session of its own);
* ``--data.prompt_dataset`` with a typo is one line naming the file before Ray starts;
* ``scripts/train_tiny_cpu.sh`` without a folder writes into a fresh one of its own;
* rpg-demo's, rpg-mechanisms' and the node check's argument errors are one line, no usage block (a
  malformed node-check report: tests/test_security.py).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

DEMO_STAGE = """
import os, signal, sys
from pathlib import Path
from rpg_openrlhf.demo import cli
from rpg_openrlhf.demo.processes import run_logged
signal.signal(signal.SIGTERM, cli._interrupt)  # what rpg-demo's main installs
child = "import os, time; open(%r, 'w').write(str(os.getpid())); time.sleep(120)" % sys.argv[1]
run_logged([sys.executable, "-c", child], Path(sys.argv[2]), dict(os.environ), 300, "a stage")
"""


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its reaper does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _within(seconds: float, done) -> bool:  # whether done() holds within ``seconds``
    deadline = time.time() + seconds
    while not done() and time.time() < deadline:
        time.sleep(0.1)
    return done()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_killed_demo_leaves_no_worker_behind(tmp_path, sig) -> None:
    pidfile = tmp_path / "worker.pid"
    demo = subprocess.Popen([sys.executable, "-c", DEMO_STAGE, str(pidfile), str(tmp_path / "stage.log")])
    assert _within(60, lambda: pidfile.exists() and pidfile.read_text())
    worker = int(pidfile.read_text())
    assert _alive(worker)
    demo.send_signal(sig)
    demo.wait(timeout=30)
    if not _within(10, lambda: not _alive(worker)):
        os.kill(worker, signal.SIGKILL)
        pytest.fail(f"the stage's worker (pid {worker}) outlived rpg-demo ({sig.name})")


@pytest.mark.parametrize("dataset", ["prompts.jsonl", "./data/prompts", "/nowhere/x.parquet"])
def test_a_missing_prompt_dataset_is_named_before_ray(tmp_path, monkeypatch, dataset) -> None:
    from rpg_openrlhf.launch import preflight

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=f"^--data.prompt_dataset {dataset}: no such file"):
        preflight.check_data(argparse.Namespace(**{"data.prompt_dataset": f"OpenRLHF/hub-set,{dataset}"}))
    # a --dry-run (the plan of a paper config before its data is prepared) notes it instead
    note = preflight.check_data(argparse.Namespace(**{"data.prompt_dataset": dataset}), dry_run=True)
    assert note == f"--data.prompt_dataset {dataset}: no such file or folder (the run itself would stop here)"
    Path(dataset.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
    if not dataset.startswith("/"):
        Path(dataset).write_text("{}\n")
        preflight.check_data(argparse.Namespace(**{"data.prompt_dataset": dataset}))  # there now
    preflight.check_data(argparse.Namespace(**{"data.prompt_dataset": "OpenRLHF/hub-set"}))  # a hub id


def test_train_tiny_cpu_defaults_to_a_fresh_folder(tmp_path) -> None:
    """Two runs without OUT_DIR write into two new folders (a stand-in python: nothing trains)."""
    env = {**os.environ, "PYTHON": "true", "TMPDIR": str(tmp_path)}
    seen = []
    for _ in range(2):
        proc = subprocess.run(["bash", str(REPO / "scripts" / "train_tiny_cpu.sh")], env=env,
                              capture_output=True, text=True, timeout=60)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        seen.append(proc.stderr.split("writing into ", 1)[1].strip())
    assert seen[0] != seen[1] and all(Path(p).parent == tmp_path and Path(p).is_dir() for p in seen)


def _one_error_line(argv: list[str], prog: str) -> str:
    """``python -m MODULE ARGS``: exit 2 and one line ``PROG: error: ...`` (no usage block, no warning)."""
    proc = subprocess.run(
        [sys.executable, "-m", *argv], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"{prog}: error: "), proc.stderr
    return lines[0]


ARGUMENT_ERRORS = [  # python -m MODULE ARGS -> the program, what its one line names
    (["rpg_openrlhf.demo", "--rl-steps", "0"], "rpg-demo", "--rl-steps"),
    (["rpg_openrlhf.mechanisms.run", "--seeds", "0"], "rpg-mechanisms", "--seeds: must be >= 1, got 0"),
    (["rpg_openrlhf.nodecheck", "--steps", "0"], "rpg-nodecheck", "--steps"),
    (["rpg_openrlhf.nodecheck", "--nope"], "rpg-nodecheck", "unrecognized arguments"),
]


@pytest.mark.parametrize(("argv", "prog", "named"), ARGUMENT_ERRORS)
def test_argument_errors_are_one_line(argv: list[str], prog: str, named: str) -> None:
    assert named in _one_error_line(argv, prog)
