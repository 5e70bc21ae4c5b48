"""Every rpg-eval writer under the project's write policy (issue #38; eval/outputs.py): a hazard planted
where a command writes is refused in one line naming it, the file outside is unchanged and nothing in
the output directory changes.

Hazards, each planted for every writer it applies to:

* a link to a file outside at an output name;
* a link on the way: ``--out`` itself a link to a folder that is not the command's (the flat writers:
  their file names never hold a ``/``), and ``run``'s ``tasks/`` replaced by a link while the run goes on;
* a FIFO at an output name (or at an input: refused, not waited on);
* a foreign non-empty ``--out`` directory (``table --out .`` in a folder of the user's files);
* a link or FIFO planted after the command's start checks, while it computes.

No model is loaded: ``run`` is refused before one loads. The helpers compare the whole output folder
before and after (names, kinds, bytes, link targets), an independent look at what changed.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from rpg_eval.cli import main as cli_main
from test_eval_compare import A, B, write_run

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"
VICTIM = b"someone else's file\n"
RUN_ARGS = ["--benchmarks", "aime24", "--backend", "hf", "--device", "cpu", "--limit", "1", "--n", "1",
            "--max-tokens", "4", "--no-summary", "--data-dir", str(DATA)]  # fmt: skip
LAYOUT = "tables:\n  t:\n    title: Ours\n    paper_table: null\n    benchmarks: [addition]\n"


def _snapshot(root: Path) -> dict[str, tuple[str, bytes | str]]:
    """Everything under ``root``, links not followed: name -> (kind, bytes or link target)."""
    out: dict[str, tuple[str, bytes | str]] = {}
    if not root.exists() and not root.is_symlink():
        return out
    for dirpath, dirs, files, _ in os.fwalk(root):
        for name in (*dirs, *files):
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = ("link", os.readlink(p))
            elif p.is_fifo():
                out[rel] = ("fifo", b"")
            elif p.is_dir():
                out[rel] = ("dir", b"")
            else:
                out[rel] = ("file", p.read_bytes())
    return out


@contextlib.contextmanager
def _no_hang(seconds: int = 20) -> Iterator[None]:
    """Fail (instead of hanging the suite) when the block blocks, e.g. on a FIFO."""

    def fail(*_: object) -> None:
        raise TimeoutError(f"blocked for {seconds} s (waiting on a FIFO?)")

    old = signal.signal(signal.SIGALRM, fail)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _refused(capsys: pytest.CaptureFixture[str], rc: int, *named: str) -> str:
    """The command failed with exit 2 and one line ``rpg-eval...: error: ...`` naming ``named``."""
    lines = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("rpg-eval"), (rc, lines)
    assert ": error: " in lines[0] and all(n in lines[0] for n in named), lines
    return lines[0]


# --------------------------------------------------------------------------- the writers


@pytest.fixture
def made(tmp_path: Path) -> dict[str, Path]:
    """Inputs of every command, and a file and a folder outside every output."""
    a, b = write_run(tmp_path / "in" / "rpg", "rpg", A), write_run(tmp_path / "in" / "grpo", "grpo", B)
    last_best = tmp_path / "in" / "last_best.csv"
    last_best.write_text(
        "run,benchmark,grader,last,last_step,last_ci_low,last_ci_high,best,best_step,best_ci_low,best_ci_high\n"
        "rpg,addition,math_verify,0.5,5,0.4,0.6,0.5,5,0.4,0.6\n"
    )
    summary = tmp_path / "in" / "summary.csv"
    summary.write_text("run,checkpoint,step,benchmark,grader,mean\nr,c,1,aime24,math_verify,0.5\n")
    (tmp_path / "in" / "layout.yaml").write_text(LAYOUT)
    victim = tmp_path / "victim.txt"
    victim.write_bytes(VICTIM)
    (tmp_path / "outside").mkdir()
    return {"a": a, "b": b, "last_best": last_best, "summary": summary, "layout": tmp_path / "in" / "layout.yaml",
            "victim": victim, "outside": tmp_path / "outside"}  # fmt: skip


#: command -> (argv with OUT for the output directory, the command's mark, a file it writes)
DIR_WRITERS: dict[str, tuple[Callable[[dict[str, Path], Path], list[str]], str, str]] = {
    "table": (
        lambda m, out: [
            "table",
            "--layout",
            str(m["layout"]),
            "--runs",
            str(m["last_best"]),
            "--formats",
            "md,csv",
            "--out",
            str(out),
        ],  # fmt: skip
        "rpg-eval table",
        "t.md",
    ),
    "plot": (
        lambda m, out: [
            "plot",
            "--summary",
            str(m["summary"]),
            "--formats",
            "png",
            "--dpi",
            "20",
            "--out",
            str(out),
        ],
        "rpg-eval plot",
        "eval.png",
    ),
    "compare": (
        lambda m, out: [
            "compare",
            str(m["a"]),
            str(m["b"]),
            "--iters",
            "20",
            "--metric",
            "mean",
            "--out",
            str(out),
        ],
        "rpg-eval compare",
        "compare.csv",
    ),
    "summarize": (
        lambda m, out: ["summarize", str(m["a"]), str(m["b"]), "--iters", "20", "--out", str(out)],
        "rpg-eval summarize",
        "last_best.csv",
    ),
}


def _marked(path: Path, mark: str) -> Path:
    """A folder the command wrote before (its mark), holding one file of an earlier call."""
    path.mkdir()
    (path / ".rpg-owner").write_text(mark + "\n")
    (path / "earlier.txt").write_text("an earlier call's\n")
    return path


@pytest.mark.parametrize("cmd", DIR_WRITERS)
def test_a_folder_writer_writes_and_marks_its_folder_then_writes_it_again(
    made, tmp_path, capsys, cmd
) -> None:
    argv, mark, name = DIR_WRITERS[cmd]
    out = tmp_path / "out"
    assert cli_main(argv(made, out)) == 0, capsys.readouterr().err
    assert (out / ".rpg-owner").read_text() == mark + "\n" and (out / name).is_file()
    assert cli_main(argv(made, out)) == 0, capsys.readouterr().err  # its own folder: written again


@pytest.mark.parametrize("hazard", ["link", "fifo"])
@pytest.mark.parametrize("cmd", DIR_WRITERS)
def test_a_link_or_fifo_at_an_output_name_is_refused(made, tmp_path, capsys, cmd, hazard) -> None:
    argv, mark, name = DIR_WRITERS[cmd]
    out = _marked(tmp_path / "out", mark)
    if hazard == "link":
        (out / name).symlink_to(made["victim"])
    else:
        os.mkfifo(out / name)
    before = _snapshot(out)
    with _no_hang():
        rc = cli_main(argv(made, out))
    _refused(capsys, rc, str(out / name), "symbolic link" if hazard == "link" else "FIFO")
    assert _snapshot(out) == before and made["victim"].read_bytes() == VICTIM


@pytest.mark.parametrize("cmd", DIR_WRITERS)
def test_a_foreign_folder_is_refused_before_anything_changes(made, tmp_path, capsys, cmd) -> None:
    """`rpg-eval table --out .` in a folder of the user's files (one named like an output among them)."""
    argv, _, name = DIR_WRITERS[cmd]
    project = tmp_path / "project"
    project.mkdir()
    (project / "README.md").write_text("the user's\n")
    (project / name).write_text("the user's own, not an output\n")
    before = _snapshot(project)
    rc = cli_main(argv(made, project))
    _refused(capsys, rc, str(project), "README.md", ".rpg-owner")
    assert _snapshot(project) == before


@pytest.mark.parametrize("cmd", DIR_WRITERS)
def test_out_linked_to_a_foreign_folder_is_refused(made, tmp_path, capsys, cmd) -> None:
    """--out a link to another folder: the folder it leads to is the output, and it is not the command's."""
    argv, _, _ = DIR_WRITERS[cmd]
    (made["outside"] / "notes.txt").write_text("the user's\n")
    link = tmp_path / "out"
    link.symlink_to(made["outside"])
    before = _snapshot(made["outside"])
    rc = cli_main(argv(made, link))
    _refused(capsys, rc, str(link), "notes.txt")
    assert _snapshot(made["outside"]) == before


#: command -> where its work is done after the start checks (module, function): a hazard planted there
#: is met by the check made again when the results are written.
WORK = {
    "table": ("rpg_eval.report.tables.cli", "build_tables"),
    "plot": ("rpg_eval.report.plots", "load_summary"),
    "compare": ("rpg_eval.stats.compare", "compare"),
    "summarize": ("rpg_eval.stats.summary", "summary_tables"),
}


@pytest.mark.parametrize("cmd", DIR_WRITERS)
def test_a_link_planted_while_the_command_works_is_refused(made, tmp_path, capsys, monkeypatch, cmd) -> None:
    import importlib

    argv, mark, name = DIR_WRITERS[cmd]
    out = _marked(tmp_path / "out", mark)
    module, function = WORK[cmd]
    mod = importlib.import_module(module)
    work = getattr(mod, function)

    def plant_then_work(*args, **kwargs):
        (out / name).symlink_to(made["victim"])
        return work(*args, **kwargs)

    monkeypatch.setattr(mod, function, plant_then_work)
    before = {**_snapshot(out), name: ("link", str(made["victim"]))}
    rc = cli_main(argv(made, out))
    _refused(capsys, rc, str(out / name), "symbolic link")
    assert _snapshot(out) == before and made["victim"].read_bytes() == VICTIM


def test_summarize_writes_beside_the_records_it_reads(made, tmp_path, capsys) -> None:
    """A folder holding only the runs it summarizes (the demo's eval/) is summarize's to write; a run
    directory of rpg-eval run too (its run.json), unmarked."""
    eval_dir = tmp_path / "eval"
    a, b = write_run(eval_dir / "rpg", "rpg", A), write_run(eval_dir / "grpo", "grpo", B)
    assert (
        cli_main(["summarize", str(a), str(b / "samples.jsonl"), "--iters", "20", "--out", str(eval_dir)])
        == 0
    )
    assert (eval_dir / ".rpg-owner").read_text() == "rpg-eval summarize\n"
    assert cli_main(["summarize", str(a), "--iters", "20", "--out", str(eval_dir)]) == 0  # marked now
    (a / "notes.txt").write_text("the run's owner's notes\n")
    (a / "run.json").write_text('{"format": "rpg-eval run/2"}')
    assert cli_main(["summarize", str(a), "--iters", "20"]) == 0, capsys.readouterr().err
    assert (a / "last_best.csv").is_file() and not (a / ".rpg-owner").exists()


# --------------------------------------------------------------------------- one named file


def _score(m: dict[str, Path], out: Path) -> list[str]:
    src = m["outside"].parent / "in" / "plain.jsonl"
    src.write_text('{"response": "\\\\boxed{1}", "gold": "1"}\n')
    return ["score", str(src), "--out", str(out)]


FILE_WRITERS: dict[str, Callable[[dict[str, Path], Path], list[str]]] = {
    "score": _score,
    "report": lambda m, out: ["report", str(out), "--runs", str(m["a"]), str(m["b"]), "--iters", "20"],
    "import-paper": lambda m, out: [
        "table",
        "import-paper",
        str(REPO / "results" / "paper" / "paper_tables.csv"),
        "--out",
        str(out),
    ],  # fmt: skip
}


@pytest.mark.parametrize("hazard", ["link", "fifo"])
@pytest.mark.parametrize("cmd", FILE_WRITERS)
def test_a_link_or_fifo_at_a_named_output_file_is_refused(made, tmp_path, capsys, cmd, hazard) -> None:
    out = tmp_path / "named" / "out.file"
    out.parent.mkdir()
    if hazard == "link":
        out.symlink_to(made["victim"])
    else:
        os.mkfifo(out)
    before = _snapshot(out.parent)
    with _no_hang():
        rc = cli_main(FILE_WRITERS[cmd](made, out))
    _refused(capsys, rc, str(out), "symbolic link" if hazard == "link" else "FIFO")
    assert _snapshot(out.parent) == before and made["victim"].read_bytes() == VICTIM


# --------------------------------------------------------------------------- rpg-eval run


def _ckpt(root: Path) -> Path:
    """A directory find_checkpoints accepts but no model loads from (the run stops before)."""
    (root / "global_step10_hf").mkdir(parents=True)
    (root / "global_step10_hf" / "config.json").write_text("{}")
    return root


def test_run_refuses_tasks_replaced_by_a_link_while_it_runs(made, tmp_path, capsys, monkeypatch) -> None:
    """`tasks/` turned into a link to another folder after the start checks: the task files went there."""
    from rpg_eval import outdir

    out = tmp_path / "run"
    write = outdir.write_run_json

    def write_then_plant(od, data):
        write(od, data)
        (out / "tasks").symlink_to(made["outside"], target_is_directory=True)

    monkeypatch.setattr(outdir, "write_run_json", write_then_plant)
    rc = cli_main(["run", "--checkpoints", str(_ckpt(tmp_path / "c")), "--out", str(out), *RUN_ARGS])
    _refused(capsys, rc, str(out / "tasks"), "symbolic link")
    assert _snapshot(made["outside"]) == {}


@pytest.mark.parametrize("name", ["samples.jsonl", "run.json"])
def test_run_refuses_a_fifo_in_its_folder_without_waiting_on_it(tmp_path, capsys, name) -> None:
    out = tmp_path / "run"
    out.mkdir()
    if name == "samples.jsonl":
        (out / "run.json").write_text(
            '{"format": "rpg-eval run/2", "settings": {}, "grading": {}, "data": {}, "checkpoints": {}}'
        )
    os.mkfifo(out / name)
    before = _snapshot(out)
    with _no_hang():
        rc = cli_main(["run", "--checkpoints", str(_ckpt(tmp_path / "c")), "--out", str(out), *RUN_ARGS])
    _refused(capsys, rc, str(out / name))
    after = _snapshot(out)
    after.pop(".lock", None)  # a refused run may have taken the lock
    assert after == before


def test_run_worker_appends_only_to_the_folder_the_run_locked(tmp_path) -> None:
    """A worker process reopens --out by its path: when the folder there is another one now (moved
    away, a link put in its place), it appends nothing."""
    from rpg_eval import outdir

    from rpg_openrlhf.common.writes import OutputDir

    locked = tmp_path / "run"
    locked.mkdir()
    with OutputDir.open(locked) as od:
        identity = outdir.identity(od)
    locked.rename(tmp_path / "moved")
    (tmp_path / "run").symlink_to(tmp_path / "outside_run", target_is_directory=True)
    (tmp_path / "outside_run").mkdir()
    with pytest.raises(outdir.OutputDirError, match="no longer the directory this run locked"):
        outdir.reopen(tmp_path / "run", identity)
    with outdir.reopen(tmp_path / "moved", identity):
        pass  # the same folder under another name is still the run's


# --------------------------------------------------------------------------- inputs


@pytest.mark.parametrize(
    "argv",
    [
        lambda f, m: ["table", "--layout", str(f), "--runs", str(m["last_best"])],
        lambda f, m: ["table", "--layout", str(m["layout"]), "--runs", str(f)],
        lambda f, m: ["plot", "--summary", str(f), "--out", str(m["outside"].parent / "p")],
    ],
    ids=["layout", "runs", "summary"],
)
def test_a_fifo_as_input_is_refused_not_waited_on(made, tmp_path, capsys, argv) -> None:
    fifo = tmp_path / "in.fifo"
    os.mkfifo(fifo)
    with _no_hang():
        rc = cli_main(argv(fifo, made))
    _refused(capsys, rc, str(fifo), "FIFO")
