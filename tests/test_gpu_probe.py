"""The one-GPU probe (``python -m rpg_openrlhf.nodecheck.probe``, issue 29) on CPU at tiny shapes, as CI
runs it so that it works the first time a GPU is there: one line per stage, the JSON rewritten after each
stage (a stage that raises is recorded and the next still runs), every registered loss in every case;
and the wheel kit's size limit (``scripts/gpu_probe_kit.sh``) with a fake pip, offline."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rpg_openrlhf.nodecheck import probe, probe_stages

REPO = Path(__file__).resolve().parents[1]
STAGES = ["environment", "losses", "policy", "zero2"]


def run_probe(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "rpg_openrlhf.nodecheck.probe", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip


@pytest.mark.slow
def test_probe_on_cpu(tmp_path: Path) -> None:
    from rpg_openrlhf.core import LOSSES

    out = tmp_path / "probe.json"
    proc = run_probe("--device", "cpu", "--out", str(out))
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith(("PASS", "FAIL"))]
    assert [line.split()[:2] for line in lines] == [["PASS", s] for s in STAGES], lines
    record = json.loads(out.read_text())
    assert list(record["stages"]) == STAGES and record["size"] == "tiny"
    cases = record["stages"]["losses"]["cases"]
    assert len(cases) == len(LOSSES) * 2 * 2 * 2  # pi_ref 2 x correction 2 x dtype 2
    assert {(c["loss"], c["style"]) for c in cases} == set(LOSSES) and not any("error" in c for c in cases)
    worst = record["stages"]["losses"]["worst"]
    assert worst["bf16"] > 100 * worst["fp32"]  # the comparison resolves the input precision
    assert set(record["stages"]["policy"]["phases"]) == set(probe_stages.TINY_TOKENS)
    assert record["stages"]["zero2"]["adam_over_planned"] == pytest.approx(1.0, rel=0.05)
    # issue 38, item 6: every stage's every measurement produced a number (none failed behind a PASS)
    assert probe.failed_measurements(record["stages"]) == []
    stages = record["stages"]
    numbers = {
        "losses": [v for c in cases for v in (c["loss_rel_err"], c["grad_rel_err"])],
        "policy": [v for p in (*stages["policy"]["phases"].values(), stages["policy"]["chunked"])
                   for v in (p["seconds"], p["tokens"])],
        "zero2": [stages["zero2"]["adam_bytes"], stages["zero2"]["init_s"]],
        "environment": [stages["environment"]["seconds"]],
    }  # fmt: skip
    for stage, values in numbers.items():
        assert values and all(isinstance(v, int | float) and math.isfinite(v) for v in values), (
            stage,
            values,
        )
    assert stages["policy"]["chunked"]["tokens"] > 0


def test_json_after_each_stage_and_a_failing_stage(tmp_path: Path, monkeypatch, capsys) -> None:
    out = tmp_path / "p.json"
    seen = {}

    def third(device, size):  # reads what the probe wrote after the first two stages
        seen.update(json.loads(out.read_text())["stages"])
        return {"ok": True, "summary": "read"}

    def boom(device, size):
        raise RuntimeError("a stage broke")

    def measured_badly(device, size):  # a stage that passes itself over a failed measurement
        return {"ok": True, "summary": "fine", "phases": {"a": {"seconds": 1.0}, "b": {"error": "shape"}}}

    stages = {"one": lambda d, s: {"ok": True, "summary": "fine"}, "two": boom, "three": third,
              "four": measured_badly}  # fmt: skip
    monkeypatch.setattr(probe_stages, "STAGES", stages)
    record = probe.run("cpu", list(stages), out)
    assert set(seen) == {"one", "two"} and not seen["two"]["ok"] and "a stage broke" in seen["two"]["summary"]
    assert (
        record["stages"]["three"]["ok"]
        and json.loads(out.read_text())["stages"]["three"]["summary"] == "read"
    )
    assert not record["stages"]["four"]["ok"] and "phases.b" in record["stages"]["four"]["summary"]
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[:2] for line in lines] == [
        ["PASS", "one"],
        ["FAIL", "two"],
        ["PASS", "three"],
        ["FAIL", "four"],
    ]


def _fake_python(tmp_path: Path, mib: int) -> Path:
    """A python whose ``-m pip download/wheel -d|-w DIR ... NAME`` writes a NAME wheel of ``mib`` MiB (tagged
    for ``--python-version`` when one is given, as pip's binary wheels are) and logs its arguments."""
    fake = tmp_path / "python"
    fake.write_text(f"""#!/usr/bin/env bash
echo "$@" >> {tmp_path}/pip.log
dir=""; last=""; tag="py3-none-any"
while [[ $# -gt 0 ]]; do case "$1" in -d|-w) dir="$2"; shift 2;;
  --python-version) tag="cp${{2/./}}-cp${{2/./}}-manylinux_2_17_x86_64"; shift 2;; *) last="$1"; shift;; esac; done
name=$(basename "$last"); name=${{name%%==*}}; name=${{name%%.tar.gz}}; name=${{name//-/_}}
[[ "$name" == deepspeed* ]] && name=deepspeed-0.19.6 tag=py3-none-any || name="$name-1.0"
truncate -s {mib}M "$dir/$name-$tag.whl"
""")
    fake.chmod(0o755)
    return fake


def _kit(tmp_path: Path, mib: int, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(REPO / "scripts" / "gpu_probe_kit.sh"), *args], capture_output=True, text=True,
                          env={**os.environ, "PYTHON": str(_fake_python(tmp_path, mib))}, timeout=120)  # fmt: skip


@pytest.mark.parametrize(("mib", "rc"), [(1, 0), (70, 1)])
def test_kit_lists_sizes_and_refuses_over_64_mib(tmp_path: Path, mib: int, rc: int) -> None:
    kit = tmp_path / "kit"
    proc = _kit(tmp_path, mib, str(kit))
    assert proc.returncode == rc, proc.stdout + proc.stderr
    assert "total" in proc.stdout and "deepspeed-0.19.6-py3-none-any.whl" in proc.stdout
    if rc:
        assert "over 64 MiB" in proc.stderr and proc.stderr.count("\n") == 1


@pytest.mark.parametrize("target", [None, "3.11"])
def test_kit_is_for_the_target_python_and_holds_nothing_stale(tmp_path: Path, target: str | None) -> None:
    """Issue 38, item 7: the compiled wheels are for the GPU machine's CPython (default 3.12, the lent
    machines'), not the one running the script; wheels an earlier run left (its .kit-wheels) are
    removed, not counted; DeepSpeed's pure wheel is reused; the user's own wheel there is kept."""
    kit = tmp_path / "kit"
    kit.mkdir()
    (kit / ".rpg-owner").write_text("gpu_probe_kit.sh\n")
    (kit / "stale-0.1-cp311-cp311-manylinux_2_17_x86_64.whl").write_bytes(b"x" * 4096)
    (kit / "deepspeed-0.19.6-py3-none-any.whl").write_bytes(b"d" * 1024)
    (kit / ".kit-wheels").write_text(
        "stale-0.1-cp311-cp311-manylinux_2_17_x86_64.whl\ndeepspeed-0.19.6-py3-none-any.whl\n"
    )
    (kit / "mine-2.0-py3-none-any.whl").write_bytes(b"m" * 10)  # the user's, not listed
    proc = _kit(tmp_path, 1, *(["--python", target] if target else []), str(kit))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    want = f"cp{(target or '3.12').replace('.', '')}"
    assert (kit / "mine-2.0-py3-none-any.whl").read_bytes() == b"m" * 10
    (kit / "mine-2.0-py3-none-any.whl").unlink()
    wheels = sorted(p.name for p in kit.glob("*.whl"))
    assert "stale-0.1-cp311-cp311-manylinux_2_17_x86_64.whl" not in wheels and "stale" not in proc.stdout
    assert all(w.startswith("deepspeed") or f"-{want}-{want}-" in w for w in wheels), wheels
    assert (kit / "deepspeed-0.19.6-py3-none-any.whl").stat().st_size == 1024  # reused, not rebuilt
    pip = (tmp_path / "pip.log").read_text()
    assert f"--python-version {target or '3.12'} --implementation cp" in pip and "--only-binary=:all:" in pip
    assert "wheel" not in pip.split()  # no DeepSpeed build
    total = sum(p.stat().st_size for p in kit.glob("*.whl"))
    assert f"{total:10d}  total (" in proc.stdout and f"for CPython {target or '3.12'}" in proc.stdout


def _make_gpu_probe(tmp_path: Path) -> subprocess.CompletedProcess:
    """``make gpu-probe`` without .venv-gpu (and none activated; the Makefile's guard that gpu-check and
    test-gpu share): one line naming make setup-gpu, not env's raw 'No such file or directory' (issue 38)."""
    drop = ("VIRTUAL_ENV", "CONDA_PREFIX", "MAKEFLAGS", "MAKELEVEL")
    return subprocess.run(["make", "-s", "gpu-probe", f"GPU_VENV={tmp_path / 'none'}"], cwd=REPO, text=True,
                          env={k: v for k, v in os.environ.items() if k not in drop}, capture_output=True, timeout=60)  # fmt: skip


def _user_kit(tmp_path: Path, kind: str) -> Path:
    """A DIR holding the user's wheel and no .rpg-owner, or a file (issue 49)."""
    kit = tmp_path / "kit"
    if kind == "file":
        kit.write_bytes(b"m")
    else:
        kit.mkdir()
        (kit / "mine-2.0-py3-none-any.whl").write_bytes(b"m")
    return kit


def _snapshot(tmp_path: Path) -> list:
    return sorted((str(p), p.read_bytes() if p.is_file() else None) for p in tmp_path.rglob("*"))


def _kit_run(kind: str | None, *args: str):
    """Set up now (a foreign folder or a file at kit/), run the kit later."""

    def setup(tmp_path: Path):
        kit = _user_kit(tmp_path, kind) if kind else tmp_path / "new"
        return lambda: _kit(tmp_path, 1, *args, str(kit))

    return setup


#: what runs (set up, then a call that runs it), what its one line names (None: the kit's path), the program
REFUSALS = {
    "probe --stages": (lambda t: lambda: run_probe("--device", "cpu", "--stages", "nope"), "--stages: unknown nope", probe.PROG),
    "probe --device": (lambda t: lambda: run_probe("--device", "tpu"), "--device: invalid choice", probe.PROG),
    "kit a foreign folder": (_kit_run("dir"), None, "gpu_probe_kit.sh: error: "),
    "kit a file": (_kit_run("file"), None, "gpu_probe_kit.sh: error: "),
    "kit --python": (_kit_run(None, "--python", "python3"), "--python takes", "gpu_probe_kit.sh: error: "),
    "make gpu-probe": (lambda t: lambda: _make_gpu_probe(t), "run make setup-gpu first", "Makefile"),
}  # fmt: skip
if not __import__("torch").cuda.is_available():
    REFUSALS["probe --device cuda"] = (
        lambda t: lambda: run_probe("--device", "cuda"),
        "--device cuda: torch",
        probe.PROG,
    )


@pytest.mark.parametrize("case", REFUSALS)
def test_bad_input_is_one_line_exit_2_and_nothing_written(tmp_path: Path, case: str) -> None:
    """As a user runs it (a subprocess: no pynvml warning, no usage block): exit 2, one line, nothing
    changed, nothing downloaded (a careless probe --out: tests/test_io_ownership.py)."""
    setup, says, prog = REFUSALS[case]
    run = setup(tmp_path)
    before = _snapshot(tmp_path)
    proc = run()
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and not proc.stdout, (proc.stdout, proc.stderr)
    assert lines[0].startswith(prog) and (says or str(tmp_path / "kit")) in lines[0], lines
    # nothing but the fake pip's python (_kit writes it), and no pip call: refused before any download
    assert [p for p in _snapshot(tmp_path) if not p[0].endswith("/python")] == before
