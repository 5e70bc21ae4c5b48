"""The output directory of ``rpg-eval run`` (rpg_eval.outdir, rpg_eval.records, rpg_eval.run.taskgen):
nothing is written through a symbolic link planted inside --out (issue #19 item 1), and a damaged
run.json of the right format is one line naming the field (item 7).

A link at a name rpg-eval writes (``.lock``, ``run.json.tmp``, ``samples.jsonl``,
``samples.jsonl.repair.tmp``, ``tasks/utils.py``) would make the write land in the file it points
to; each case checks the file outside --out is byte-identical afterwards and the directory is
not turned into links. No model is needed: the run is refused before one loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rpg_eval.cli import main as cli_main

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"
RUN_ARGS = ["--benchmarks", "aime24", "--backend", "hf", "--device", "cpu", "--limit", "1", "--n", "1",
            "--max-tokens", "4", "--no-summary", "--data-dir", str(DATA)]  # fmt: skip
VICTIM = b"precious bytes outside --out\n"


def _error_line(err: str, prog: str = "rpg-eval") -> str:
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error:"), err
    return lines[0]


def _fake_ckpt(root: Path) -> Path:
    """A directory find_checkpoints accepts but no model loads from (the run must stop before)."""
    d = root / "global_step10_hf"
    d.mkdir(parents=True)
    (d / "config.json").write_text("{}")
    return root


def _victim(tmp_path: Path) -> Path:
    v = tmp_path / "victim.txt"
    v.write_bytes(VICTIM)
    return v


@pytest.mark.parametrize("name", [".lock", "run.json.tmp"])
def test_link_in_a_new_out_is_refused_and_not_followed(tmp_path: Path, capsys, name: str) -> None:
    """`ln -s /tmp/victim o/.lock` truncated the victim to a PID; `o/run.json.tmp -> victim` wrote
    run.json into it and left run.json a link to it."""
    victim = _victim(tmp_path)
    out = tmp_path / "o"
    out.mkdir()
    (out / name).symlink_to(victim)
    rc = cli_main(["run", "--checkpoints", str(_fake_ckpt(tmp_path / "c")), "--out", str(out), *RUN_ARGS])
    line = _error_line(capsys.readouterr().err)
    assert rc == 2 and "symbolic link" in line and name in line
    assert victim.read_bytes() == VICTIM
    assert sorted(p.name for p in out.iterdir()) == [name]  # nothing added, the link left as it was
    assert not (out / "run.json").exists()


def _run_dir(tmp_path: Path) -> Path:
    """A directory a run wrote: run.json of this format (no records yet)."""
    out = tmp_path / "run"
    out.mkdir()
    meta = {"format": "rpg-eval run/2", "settings": {}, "grading": {}, "data": {}, "checkpoints": {}}
    (out / "run.json").write_text(json.dumps(meta))
    return out


@pytest.mark.parametrize("name", ["samples.jsonl", "samples.jsonl.repair.tmp", "tasks"])
def test_link_in_a_run_dir_is_refused(tmp_path: Path, capsys, name: str) -> None:
    victim = _victim(tmp_path)
    out = _run_dir(tmp_path)
    (out / name).symlink_to(victim if name != "tasks" else tmp_path)
    rc = cli_main(["run", "--checkpoints", str(_fake_ckpt(tmp_path / "c")), "--out", str(out), *RUN_ARGS])
    line = _error_line(capsys.readouterr().err)
    assert rc == 2 and "symbolic link" in line and name in line
    assert victim.read_bytes() == VICTIM and (out / name).is_symlink()


def _record(pid: str, j: int) -> dict:
    return {"run": "r", "checkpoint": "c", "step": 1, "benchmark": "aime24", "problem_id": pid,
            "problem_index": 0, "sample_index": j, "prompt_style": "boxed", "gold": "1",
            "response": "\\boxed{1}", "extracted": {"math_verify": "1", "paper": None},
            "correct": {"math_verify": True, "paper": False}}  # fmt: skip


def test_repair_does_not_write_through_a_linked_temp_file(tmp_path: Path) -> None:
    """`samples.jsonl.repair.tmp -> victim` plus a torn middle line: the repair wrote the records
    into the victim and left samples.jsonl a link to it (later appends then went outside)."""
    from rpg_eval import records as rec

    victim = _victim(tmp_path)
    path = tmp_path / "samples.jsonl"
    lines = [json.dumps(_record("a", 0)), '{"run": "r", "chec', json.dumps(_record("b", 0))]
    path.write_text("\n".join(lines) + "\n")
    before = path.read_bytes()
    (tmp_path / "samples.jsonl.repair.tmp").symlink_to(victim)
    with pytest.raises(ValueError, match="symbolic link"):
        rec.repair_counts(path)
    assert victim.read_bytes() == VICTIM
    assert not path.is_symlink() and path.read_bytes() == before


def test_append_does_not_follow_a_linked_samples_file(tmp_path: Path) -> None:
    from rpg_eval import records as rec

    victim = _victim(tmp_path)
    path = tmp_path / "samples.jsonl"
    path.symlink_to(victim)
    with pytest.raises(ValueError, match="symbolic link"):
        rec.append(path, [_record("a", 0)])
    assert victim.read_bytes() == VICTIM


def test_task_files_never_write_through_a_link(tmp_path: Path) -> None:
    """`tasks/utils.py -> victim` was overwritten with the task shim. Now the link is refused (the
    project's write policy, rpg_openrlhf.common.writes) or replaced by a file of rpg-eval's own; the
    file it points to is never written."""
    from rpg_eval.run.taskgen import write_tasks

    victim = _victim(tmp_path)
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "utils.py").symlink_to(victim)
    (tasks / "rpg_aime24.yaml").symlink_to(victim)
    try:
        write_tasks(tasks, benchmarks=["aime24"], styles=["boxed"], n=2)
    except ValueError as e:  # refused, naming the link
        assert "link" in str(e) and str(tasks) in str(e)
    else:
        assert (
            not (tasks / "utils.py").is_symlink()
            and "rpg_eval.run.tasks.utils" in (tasks / "utils.py").read_text()
        )
        assert not (tasks / "rpg_aime24.yaml").is_symlink()
    assert victim.read_bytes() == VICTIM


# --------------------------------------------------------------------------- item 7: damaged run.json


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"settings": []}, "'settings'"),
        ({"checkpoints": {"global_step10_hf": 5}}, "'checkpoints.global_step10_hf'"),
        ({"data": {"aime24": "aime24.jsonl"}}, "'data.aime24'"),
        ({"checkpoints": {"global_step10_hf": {"path": "x", "step": "10", "sha256": "0"}}}, "step"),
    ],
)
def test_run_json_with_wrong_types_is_one_line(tmp_path: Path, capsys, change: dict, named: str) -> None:
    out = _run_dir(tmp_path)
    meta = json.loads((out / "run.json").read_text())
    (out / "run.json").write_text(json.dumps({**meta, **change}))
    before = (out / "run.json").read_bytes()
    rc = cli_main(["run", "--checkpoints", str(_fake_ckpt(tmp_path / "c")), "--out", str(out), *RUN_ARGS])
    line = _error_line(capsys.readouterr().err)
    assert rc == 2 and str(out / "run.json") in line and named in line
    assert (out / "run.json").read_bytes() == before
