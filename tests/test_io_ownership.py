"""Guarantee 2 (docs/contracts.md, "Threat model"): nothing this tool did not create is overwritten.

A table of every command that writes x the careless targets a user hands it as output: an existing
file, a symbolic link, a FIFO, a non-empty folder the tool did not make, one of the command's own
inputs. Each is refused with one line naming the path, exit 2, and nothing on disk changes (the
whole tree is compared before and after, links not followed). A folder the command makes carries its
ownership mark, and the same command run again into it is accepted, as are today's marks.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from rpg_eval.cli import main as cli_main
from test_eval_compare import A, B, write_run

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"
LAYOUT = "tables:\n  t:\n    title: Ours\n    paper_table: null\n    benchmarks: [addition]\n"
RUN_ARGS = ["--benchmarks", "aime24", "--backend", "hf", "--device", "cpu", "--limit", "1", "--n", "1",
            "--max-tokens", "4", "--no-summary", "--data-dir", str(DATA)]  # fmt: skip


def _snapshot(root: Path) -> dict[str, object]:
    """Everything under ``root``, links not followed: name -> link target, bytes, or the mode."""
    return {str(p.relative_to(root)): ("link", os.readlink(p)) if p.is_symlink() else
            p.read_bytes() if p.is_file() else p.stat().st_mode for p in root.rglob("*")}  # fmt: skip


@pytest.fixture
def made(tmp_path: Path) -> dict[str, Path]:
    """Inputs of every command, under tmp_path/in."""
    i = tmp_path / "in"
    files = {
        "last_best.csv": "run,benchmark,grader,last,last_step,last_ci_low,last_ci_high,best,best_step,best_ci_low,"
        "best_ci_high\nrpg,addition,math_verify,0.5,5,0.4,0.6,0.5,5,0.4,0.6\n",
        "layout.yaml": LAYOUT,
        "summary.csv": "run,checkpoint,step,benchmark,grader,mean\nr,c,1,aime24,math_verify,0.5\n",
        "plain.jsonl": '{"response": "\\\\boxed{1}", "gold": "1"}\n',
        "ckpt/global_step10_hf/config.json": "{}",
        "prompts.jsonl": '{"problem": "1+1?", "answer": "2"}\n',
    }
    for name, text in files.items():
        (i / name).parent.mkdir(parents=True, exist_ok=True)
        (i / name).write_text(text)
    return {"a": write_run(i / "rpg", "rpg", A), "b": write_run(i / "grpo", "grpo", B), "ckpt": i / "ckpt",
            **{name.split(".")[0]: i / name for name in files if "/" not in name}}  # fmt: skip


def _main(module: str, *argv: str) -> int:
    """``module``'s main(argv) in this process: its exit status, returned or raised (SystemExit)."""
    try:
        return int(__import__(module, fromlist=["main"]).main(list(argv)) or 0)
    except SystemExit as e:
        return int(e.code or 0)


def _train(flag: str) -> Callable[[dict[str, Path], Path], int]:
    """rpg-train's preflight (what it runs before anything is written) on --ckpt.path / --ckpt.output_dir."""
    from rpg_openrlhf.launch import preflight

    def run(m: dict[str, Path], out: Path) -> int:
        try:
            preflight.check_outputs(
                argparse.Namespace(**{"ckpt.path": None, "ckpt.output_dir": None, flag: str(out)})
            )
        except ValueError as e:
            print(f"rpg-train: error: {e}", file=sys.stderr)
            return 2
        return 0

    return run


# fmt: off
#: command -> its call with the output folder OUT
FOLDER_WRITERS: dict[str, Callable[[dict[str, Path], Path], int]] = {
    "table": lambda m, o: cli_main(["table", "--layout", str(m["layout"]), "--runs", str(m["last_best"]), "--formats", "md,csv", "--out", str(o)]),
    "plot": lambda m, o: cli_main(["plot", "--summary", str(m["summary"]), "--formats", "png", "--dpi", "20", "--out", str(o)]),
    "compare": lambda m, o: cli_main(["compare", str(m["a"]), str(m["b"]), "--iters", "20", "--metric", "mean", "--out", str(o)]),
    "summarize": lambda m, o: cli_main(["summarize", str(m["a"]), str(m["b"]), "--iters", "20", "--out", str(o)]),
    "run": lambda m, o: cli_main(["run", "--checkpoints", str(m["ckpt"]), "--out", str(o), *RUN_ARGS]),
    "mechanisms": lambda m, o: _main("rpg_openrlhf.mechanisms.run", "--quick", "--out", str(o)),
    "demo": lambda m, o: _main("rpg_openrlhf.demo.cli", "--quick", "--out", str(o)),
    "nodecheck": lambda m, o: _main("rpg_openrlhf.nodecheck.cli", "--out", str(o)),
    "train-ckpt.path": _train("ckpt.path"),
    "train-ckpt.output_dir": _train("ckpt.output_dir"),
}

#: command -> its call with the output file OUT; the input it reads (None: none)
FILE_WRITERS: dict[str, tuple[Callable[[dict[str, Path], Path], int], str | None]] = {
    "score": (lambda m, o: cli_main(["score", str(m["plain"]), "--out", str(o)]), "plain"),
    "report": (lambda m, o: cli_main(["report", str(o), "--runs", str(m["a"]), "--iters", "20"]), "a/samples.jsonl"),
    "import-paper": (lambda m, o: cli_main(["table", "import-paper", str(m["summary"]), "--out", str(o)]), "summary"),
    "prepare-data": (lambda m, o: _main("rpg_openrlhf.data", "--input", str(m["prompts"]), "--output", str(o)), "prompts"),
    "gpu-probe": (lambda m, o: _main("rpg_openrlhf.nodecheck.probe", "--device", "cpu", "--out", str(o)), None),
}
# fmt: on


def _plant(target: str, where: Path, elsewhere: Path) -> None:
    """A careless target at ``where``."""
    elsewhere.mkdir(exist_ok=True)
    {
        "file": lambda: where.write_text("the user's file\n"),
        "link": lambda: where.symlink_to(elsewhere),
        "fifo": lambda: os.mkfifo(where),
        "folder": where.mkdir,
        "foreign": lambda: (where.mkdir(), (where / "README.md").write_text("the user's project\n")),
    }[target]()


def _refused(capsys: pytest.CaptureFixture[str], rc: int, named: Path) -> None:
    """Exit 2, and one line ``PROG: error: ...`` on stderr naming ``named``."""
    lines = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert rc == 2 and len(lines) == 1, (rc, lines)
    assert ": error: " in lines[0] and str(named) in lines[0], lines


@pytest.mark.timeout(300)  # a FIFO waited on fails, not hangs
@pytest.mark.parametrize("target", ["file", "link", "fifo", "foreign"])
@pytest.mark.parametrize("cmd", FOLDER_WRITERS)
def test_a_folder_writer_refuses_what_it_did_not_make(made, tmp_path, capsys, cmd, target) -> None:
    out = tmp_path / "out"
    _plant(target, out, tmp_path / "elsewhere")
    before = _snapshot(tmp_path)
    _refused(capsys, FOLDER_WRITERS[cmd](made, out), out)
    assert _snapshot(tmp_path) == before


@pytest.mark.timeout(300)  # a FIFO waited on fails, not hangs
@pytest.mark.parametrize("target", ["link", "fifo", "folder", "input"])
@pytest.mark.parametrize("cmd", FILE_WRITERS)
def test_a_file_writer_refuses_a_link_a_fifo_a_folder_and_its_input(made, tmp_path, capsys, cmd, target):
    call, source = FILE_WRITERS[cmd]
    if target == "input":
        if source is None:
            pytest.skip("reads no input file")
        first, _, rest = source.partition("/")
        out = made[first] / rest if rest else made[first]
    else:
        out = tmp_path / "named" / "out.file"
        out.parent.mkdir()
        _plant(target, out, tmp_path / "elsewhere")
    before = _snapshot(tmp_path)
    _refused(capsys, call(made, out), out)
    assert _snapshot(tmp_path) == before


@pytest.mark.parametrize("cmd", ["table", "plot", "compare", "summarize"])
def test_a_folder_is_marked_and_the_same_command_writes_it_again(made, tmp_path, capsys, cmd) -> None:
    out = tmp_path / "out"
    assert FOLDER_WRITERS[cmd](made, out) == 0, capsys.readouterr().err
    assert (out / ".rpg-owner").read_text() == f"rpg-eval {cmd}\n"
    assert FOLDER_WRITERS[cmd](made, out) == 0, capsys.readouterr().err  # its own folder
    other = "table" if cmd != "table" else "plot"
    _refused(capsys, FOLDER_WRITERS[other](made, out), out)  # another command's folder


def test_todays_marks_are_accepted(tmp_path) -> None:
    """Folders written by today's version resume: a --ckpt.path holding rpg_checkpoints.json or
    OpenRLHF's _actor/, the demo's committed copy (summary.json), an eval run (its run.json)."""
    from rpg_eval import outdir

    from rpg_openrlhf.common.atomic import check_dir
    from rpg_openrlhf.launch.preflight import CKPT_MARKS

    for name in ("rpg_checkpoints.json", "_actor"):
        (tmp_path / name / "global_step2").mkdir(parents=True)
        (tmp_path / name / name / "x").mkdir(parents=True)  # a file or a folder: a mark either way
        check_dir(tmp_path / name, "rpg-train", "--ckpt.path", CKPT_MARKS)
    demo = tmp_path / "demo"
    demo.mkdir()
    (demo / "summary.json").write_text("{}")
    check_dir(demo, "rpg-demo", marks=("summary.json",))
    with pytest.raises(ValueError, match="no .rpg-owner"):
        check_dir(demo, "rpg-demo")  # without the mark it is a foreign folder
    run = write_run(tmp_path / "evalrun", "rpg", A)
    (run / "run.json").write_text(
        '{"format": "rpg-eval run/2", "settings": {}, "grading": {}, "data": {}, "checkpoints": {}}'
    )
    outdir.check_ownership(run)


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


@pytest.mark.timeout(300)  # a FIFO waited on fails, not hangs
def test_a_fifo_as_input_is_refused_not_waited_on(made, tmp_path, capsys) -> None:
    fifo = tmp_path / "in.fifo"
    os.mkfifo(fifo)
    _refused(capsys, cli_main(["table", "--layout", str(fifo), "--runs", str(made["last_best"])]), fifo)
