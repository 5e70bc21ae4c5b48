"""The one-GPU probe (``python -m rpg_openrlhf.nodecheck.probe``, issue 29) on CPU at tiny shapes, as CI
runs it so that it works the first time a GPU is there: one line per stage, the JSON rewritten after each
stage (a stage that raises is recorded and the next still runs), every registered loss in every case;
and the wheel kit's size limit (``scripts/gpu_probe_kit.sh``) with a fake pip, offline."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rpg_openrlhf.nodecheck import probe, probe_stages

REPO = Path(__file__).resolve().parents[1]
STAGES = ["environment", "losses", "loss-cost", "policy", "zero2"]


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


def test_json_after_each_stage_and_a_failing_stage(tmp_path: Path, monkeypatch, capsys) -> None:
    out = tmp_path / "p.json"
    seen = {}

    def third(device, size):  # reads what the probe wrote after the first two stages
        seen.update(json.loads(out.read_text())["stages"])
        return {"ok": True, "summary": "read"}

    def boom(device, size):
        raise RuntimeError("a stage broke")

    stages = {"one": lambda d, s: {"ok": True, "summary": "fine"}, "two": boom, "three": third}
    monkeypatch.setattr(probe_stages, "STAGES", stages)
    record = probe.run("cpu", list(stages), out)
    assert set(seen) == {"one", "two"} and not seen["two"]["ok"] and "a stage broke" in seen["two"]["summary"]
    assert (
        record["stages"]["three"]["ok"]
        and json.loads(out.read_text())["stages"]["three"]["summary"] == "read"
    )
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[:2] for line in lines] == [["PASS", "one"], ["FAIL", "two"], ["PASS", "three"]]


def test_bad_arguments() -> None:
    bad = run_probe("--device", "cpu", "--stages", "nope")
    assert bad.returncode == 2 and "--stages: unknown nope" in bad.stderr
    if not __import__("torch").cuda.is_available():
        no_cuda = run_probe("--device", "cuda")
        assert (
            no_cuda.returncode == 2
            and "--device cuda: torch" in no_cuda.stderr
            and "no CUDA" in no_cuda.stderr
        )


def _fake_python(tmp_path: Path, mib: int) -> Path:
    """A python whose ``-m pip download/wheel -d|-w DIR ... NAME`` writes a NAME wheel of ``mib`` MiB."""
    fake = tmp_path / "python"
    fake.write_text(f"""#!/usr/bin/env bash
dir=""; last=""
while [[ $# -gt 0 ]]; do case "$1" in -d|-w) dir="$2"; shift 2;; *) last="$1"; shift;; esac; done
name=$(basename "$last"); name=${{name%%==*}}; name=${{name%%.tar.gz}}; name=${{name//-/_}}
[[ "$name" == deepspeed* ]] && name=deepspeed-0.19.6 || name="$name-1.0"
truncate -s {mib}M "$dir/$name-py3-none-any.whl"
""")
    fake.chmod(0o755)
    return fake


@pytest.mark.parametrize(("mib", "rc"), [(1, 0), (70, 1)])
def test_kit_lists_sizes_and_refuses_over_64_mib(tmp_path: Path, mib: int, rc: int) -> None:
    kit = tmp_path / "kit"
    proc = subprocess.run([str(REPO / "scripts" / "gpu_probe_kit.sh"), str(kit)], capture_output=True, text=True,
                          env={**os.environ, "PYTHON": str(_fake_python(tmp_path, mib))}, timeout=120)  # fmt: skip
    assert proc.returncode == rc, proc.stdout + proc.stderr
    assert "total" in proc.stdout and "deepspeed-0.19.6-py3-none-any.whl" in proc.stdout
    if rc:
        assert "over 64 MiB" in proc.stderr and proc.stderr.count("\n") == 1
