"""Careless and hostile input to rpg-eval (issues #14, #19): nothing lost, nothing mixed, one clear line.

A resume that would mix records refuses naming what changed; summaries count each key once; numeric
options are checked before anything is written; a failure is one line, exit 2; ``run --out`` inside a
checkpoint, checkpoints added to or torn, step names without a number, meaningless table scores,
/dev/zero (run under a 2 GiB address-space limit and a timeout, so a regression fails instead of
filling the machine), one colour per method. The slow tests share one real run (tiny checkpoint,
lm-eval hf backend) and resume copies of it with one thing changed. (Bad benchmark data, golds empty
after normalization, FIFOs as data: tests/test_eval_data.py.)
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from rpg_eval.cli import main as cli_main
from rpg_eval.run.checkpoints import CheckpointNameError, find_checkpoints

from rpg_openrlhf.common import checkpoints as ck

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"
RUN_ARGS = ["--benchmarks", "aime24", "--backend", "hf", "--device", "cpu", "--limit", "2", "--n", "2",
            "--max-tokens", "4", "--chunk", "2", "--no-summary"]  # fmt: skip


def _error_line(err: str, prog: str = "rpg-eval") -> str:
    """The single error line (warnings from libraries aside); fails if there is not exactly one."""
    lines = [x for x in err.splitlines() if re.match(rf"{prog}( [a-z]+)?: error:", x)]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _model_dirs(root: Path, names: list[str]) -> Path:
    """Directories find_checkpoints accepts (config.json) but no model can be loaded from."""
    for n in names:
        (root / n).mkdir(parents=True)
        (root / n / "config.json").write_text("{}")
    return root


def _files(root: Path) -> dict[str, bytes]:
    """Every file under root and its bytes (the lock file aside: a refused run may take the lock)."""
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != ".lock"
    }


# --------------------------------------------------------------------------- item 5: parse-time checks


def test_run_config_validates_numbers_too(tmp_path: Path) -> None:
    """The Python API (RunConfig) refuses what the flags refuse (tests/test_eval_cli.py) before
    anything is written."""
    from rpg_eval.run.runner import RunConfig, run

    cfg = RunConfig(
        checkpoints=str(tmp_path / "nowhere"), out=str(tmp_path / "o"), benchmarks=["aime24"], limit=-29
    )
    with pytest.raises(ValueError, match="--limit"):
        run(cfg)
    assert not (tmp_path / "o").exists()


def test_mechanisms_seeds_checked_before_writing(tmp_path: Path) -> None:
    from rpg_openrlhf.mechanisms.run import main

    out = tmp_path / "mech"
    with pytest.raises(SystemExit) as e:
        main(["--quick", "--seeds", "-1", "--out", str(out)])
    assert e.value.code == 2 and not out.exists()


# --------------------------------------------------------------------------- item 7: one line, exit 2


def _records_file(tmp_path: Path, lines: list[str]) -> Path:
    p = tmp_path / "samples.jsonl"
    p.write_text("".join(x + "\n" for x in lines))
    return p


def test_run_failures_are_one_line(tmp_path: Path, capsys) -> None:
    """No checkpoints, a missing or malformed data file, a mistyped local path (not taken for a hub
    dataset: "Couldn't reach 'nodir' on the Hub"), an unknown benchmark: one line, nothing in --out."""
    ckpts = _model_dirs(tmp_path / "c", ["global_step10_hf"])
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "problem": "p"}\n')
    cases = [
        (["--checkpoints", str(tmp_path / "missing"), "--data-dir", str(DATA)], "missing"),
        (["--checkpoints", str(ckpts), "--data", f"aime24={tmp_path / 'none.jsonl'}"], "none.jsonl"),
        (["--checkpoints", str(ckpts), "--data", f"aime24={bad}"], f"{bad}:1: missing field 'answer'"),
        (["--checkpoints", str(ckpts), "--data-dir", "nodir"], "nodir: no such file or directory"),
        (["--checkpoints", str(ckpts), "--benchmarks", "demo", "--data", "demo=missing.json"],
         "missing.json: no such file or directory"),
        (["--checkpoints", str(ckpts), "--data-dir", str(DATA), "--benchmarks", "nope"], "nope"),
    ]  # fmt: skip
    for args, named in cases:
        rc = cli_main(["run", "--out", str(tmp_path / "o"), *RUN_ARGS, *args])
        line = _error_line(capsys.readouterr().err)
        assert rc == 2 and named in line and "Hub" not in line, (args, line)
        assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir()), args


def test_score_and_summarize_failures_are_one_line(tmp_path: Path, capsys) -> None:
    bad = _records_file(tmp_path, ['{"response": "\\\\boxed{1}", "gold": "1"}', "[1, 2]"])
    assert cli_main(["score", str(bad)]) == 2
    assert f"{bad}:2" in _error_line(capsys.readouterr().err)
    assert cli_main(["summarize", str(tmp_path / "nothing.jsonl")]) == 2
    assert "nothing.jsonl" in _error_line(capsys.readouterr().err)


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    """The real console entry point (one line by default: tests/test_eval_cli.py) shows the traceback
    with RPG_DEBUG=1 / --debug."""
    bad = _records_file(tmp_path, ['{"a": 1}'])
    cmd = [sys.executable, "-m", "rpg_eval.cli", "summarize", str(bad)]
    for extra, env in (([], {"RPG_DEBUG": "1"}), (["--debug"], {})):
        dbg = subprocess.run(
            [*cmd, *extra], capture_output=True, text=True, timeout=120, env={**os.environ, **env}
        )
        assert dbg.returncode == 2 and "Traceback" in dbg.stderr and "RecordError" in dbg.stderr


# --------------------------------------------------------------------------- item 4: summaries count keys once


def _record(step: int, pid: str, j: int, ok: bool) -> dict:
    return {"run": "r", "checkpoint": f"global_step{step}_hf", "step": step, "benchmark": "aime24",
            "problem_id": pid, "problem_index": 0, "sample_index": j, "prompt_style": "boxed",
            "gold": "1", "response": "\\boxed{1}" if ok else "\\boxed{2}", "seed": 0,
            "extracted": {"math_verify": "1" if ok else "2", "paper": None}, "error_math_verify": None,
            "correct": {"math_verify": ok, "paper": False}, "sampling": {"n": 2}}  # fmt: skip


def test_summaries_count_each_key_once(tmp_path: Path, capsys) -> None:
    """Records written twice (two runs into one directory, before the lock existed) count once."""
    from rpg_eval import records as rec
    from rpg_eval.stats.summary import summarize

    recs = [
        _record(1, p, j, ok)
        for p, oks in (("a", (True, False)), ("b", (True, True)))
        for j, ok in enumerate(oks)
    ]
    samples = tmp_path / "samples.jsonl"
    rec.append(samples, recs)
    rec.append(samples, recs)  # every key twice: 8 lines, 4 keys
    res = summarize([samples], tmp_path, iters=10)
    dis = json.loads((tmp_path / "disagreements.json").read_text())
    assert dis["n_samples"] == 4 and dis["math_verify_only"] == 3  # 3 correct by math_verify, paper none
    (row,) = [r for r in res["summary"] if r["grader"] == "math_verify"]
    assert (row["n_problems"], row["n_samples"], row["mean"]) == (2, 2, 0.75)  # (1/2 + 2/2) / 2
    assert "4 duplicate records" in capsys.readouterr().err


# --------------------------------------------------------------------------- careless input (issue #19)


def _committed(run: Path, step: int, extra: dict[str, str] | None = None) -> Path:
    """A committed global_step<step>_hf of a run that declares markers (config.json only)."""
    ck.declare(run)
    d = run / f"global_step{step}_hf"
    d.mkdir(parents=True)
    (d / "config.json").write_text("{}")
    (d / "model.safetensors").write_bytes(b"\0" * 64)
    ck.write_marker(d, f"global_step{step}", step)
    for name, text in (extra or {}).items():
        (d / name).parent.mkdir(parents=True, exist_ok=True)
        (d / name).write_text(text)
    return d


def _limited(argv: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
    """Run ``argv`` under a 2 GiB address-space limit (an unbounded read dies, not the machine)."""
    code = (
        "import resource, runpy, sys; resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30)); "
        f"sys.argv = {argv!r}; runpy.run_module(sys.argv[0], run_name='__main__')"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    try:
        return subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{argv} still running after {timeout} s (reading forever, or blocked on a FIFO)")


def test_run_out_inside_a_checkpoint_is_refused_and_nothing_is_written(tmp_path: Path, capsys) -> None:
    run = tmp_path / "ckpt"
    d = _committed(run, 1)
    before = sorted(p.name for p in d.iterdir())
    out = d / "eval"
    rc = cli_main(["run", "--checkpoints", str(run), "--out", str(out), "--data-dir", str(DATA), *RUN_ARGS])
    line = _error_line(capsys.readouterr().err)
    assert rc == 2 and "inside the checkpoint" in line and str(d) in line, line
    assert sorted(p.name for p in d.iterdir()) == before and ck.is_complete(d)


def test_added_files_are_named_and_the_committed_checkpoint_is_still_evaluated(tmp_path: Path) -> None:
    run = tmp_path / "ckpt"
    _committed(run, 1, {"README.md": "notes", "eval/summary.csv": "x"})
    skipped: list[Path] = []
    notes: list[str] = []
    assert [c.name for c in find_checkpoints(run, skipped=skipped, notes=notes)] == ["global_step1_hf"]
    assert skipped == [] and len(notes) == 1 and "README.md" in notes[0] and "eval/summary.csv" in notes[0]


def test_a_torn_checkpoint_with_a_marker_is_not_called_markerless(tmp_path: Path) -> None:
    run = tmp_path / "ckpt"
    d = _committed(run, 1)
    (d / "model.safetensors").write_bytes(b"\0" * 10)  # cut after the commit
    with pytest.raises(FileNotFoundError) as e:
        find_checkpoints(run)
    assert "model.safetensors" in str(e.value) and "no completeness marker" not in str(e.value), e.value


@pytest.mark.parametrize("bad", ["global_stepNaN"])
def test_a_step_name_without_a_step_number_is_refused(tmp_path: Path, bad: str) -> None:
    root = _model_dirs(tmp_path / "run", ["global_step2_hf", bad])
    with pytest.raises(CheckpointNameError, match="not a number") as e:
        find_checkpoints(root)
    assert bad in str(e.value)


def test_two_checkpoints_of_one_step_are_refused_naming_both(tmp_path: Path, capsys) -> None:
    root = _model_dirs(tmp_path / "run", ["global_step00010", "global_step10", "global_step20"])
    with pytest.raises(CheckpointNameError) as e:
        find_checkpoints(root)
    assert "global_step00010 and global_step10 are both step 10" in str(e.value)
    # the final directory's step given by --final-step must not be another checkpoint's
    root2 = _model_dirs(tmp_path / "run2", ["global_step10_hf", "final"])
    with pytest.raises(CheckpointNameError, match="both step 10"):
        find_checkpoints(root2, final_step=10)
    # zero-padded names alone, and the same step in two runs' directories, stay accepted
    assert [
        c.step
        for c in find_checkpoints(_model_dirs(tmp_path / "run3", ["checkpoint-0005", "checkpoint-0010"]))
    ] == [5, 10]


def _write(path: Path, head: list[str], rows: list[dict]) -> Path:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=head)
        w.writeheader()
        w.writerows(rows)
    return path


LAST_BEST = ["run", "benchmark", "grader", "last", "last_step", "last_ci_low", "last_ci_high", "best", "best_step",
             "best_ci_low", "best_ci_high"]  # fmt: skip
ROW = {"run": "a", "benchmark": "aime24", "grader": "math_verify", "last": 0.3, "last_step": 10, "last_ci_low": 0.2,
       "last_ci_high": 0.4, "best": 0.35, "best_step": 5, "best_ci_low": 0.25, "best_ci_high": 0.45}  # fmt: skip
SUMMARY = ["run", "checkpoint", "step", "benchmark", "grader", "mean"]
SUMMARY_ROW = {"run": "a", "checkpoint": "c1", "step": "1", "benchmark": "aime24", "grader": "g", "mean": 0.2}


@pytest.mark.parametrize(
    "summary,bad,what",
    [(False, {"last": -0.2, "last_ci_low": -0.3, "last_ci_high": -0.1}, "row 3 .*'last' is negative"),
     (False, {"best": 0.4, "best_ci_low": 0.5}, "row 3 .*'best_ci_low' is above 'best'"),
     (False, {"last_step": "10.5"}, "column 'last_step' row 3 .*not a checkpoint step"),
     (True, {"step": "1e3", "checkpoint": "c2"}, "column 'step' row 3 .*not a checkpoint step")]
)  # fmt: skip
def test_table_refuses_a_meaningless_row_naming_it(
    tmp_path: Path, summary: bool, bad: dict, what: str
) -> None:
    """A negative score, one outside its interval, a step that is no step: refused naming file and row."""
    from rpg_eval.report.tables import TableError, load_runs

    head, row = (SUMMARY, SUMMARY_ROW) if summary else (LAST_BEST, ROW)
    assert len(load_runs([_write(tmp_path / "good.csv", head, [row])])) == 1
    f = _write(tmp_path / "runs.csv", head, [row, {**row, "run": "b", **bad}])
    with pytest.raises(TableError, match=what) as e:
        load_runs([f])
    assert str(f) in str(e.value)


def test_a_jsonl_linked_to_dev_zero_is_refused_not_read(tmp_path: Path) -> None:
    link = tmp_path / "samples.jsonl"
    link.symlink_to("/dev/zero")
    res = _limited(["rpg_eval.cli", "summarize", str(link)])
    line = _error_line(res.stderr)
    assert res.returncode == 2 and "character device" in line and str(link) in line, res.stderr[-2000:]


def test_a_failed_summary_leaves_no_empty_out(tmp_path: Path, capsys) -> None:
    f = tmp_path / "samples.jsonl"
    f.write_text(json.dumps(_record(1, "p", 0, True)) + "\n"
                 + json.dumps({**_record(1, "p", 1, True), "prompt_style": "dapo"}) + "\n")  # fmt: skip
    out = tmp_path / "new_out"
    assert cli_main(["summarize", str(f), "--out", str(out)]) == 2
    assert "mixes prompt styles" in _error_line(capsys.readouterr().err) and not out.exists()


def test_bootstrap_in_chunks_draws_the_numbers_of_one_draw() -> None:
    """The chunked bootstrap against the plain formula written here (one (iters, n) draw)."""
    import numpy as np
    from rpg_eval.stats import metrics

    x = np.linspace(0, 1, 37) ** 2
    rng = np.random.default_rng(3)
    means = x[rng.integers(0, x.size, size=(5000, x.size))].mean(axis=1)
    want = tuple(float(v) for v in np.quantile(means, [0.025, 0.975]))
    old = metrics._CHUNK_ELEMENTS
    try:
        metrics._CHUNK_ELEMENTS = 37 * 7  # 7 resamples per chunk
        assert metrics.bootstrap_ci(x, iters=5000, seed=3) == want
    finally:
        metrics._CHUNK_ELEMENTS = old
    with pytest.raises(ValueError, match="iters"):
        metrics.bootstrap_ci(x, iters=metrics.MAX_ITERS + 1)


def test_plot_shows_numbers_plainly(tmp_path: Path, capsys) -> None:
    from rpg_eval.report.plots import main as plot_main

    f = tmp_path / "summary.csv"
    f.write_text("run,step,benchmark,mean\nr,1,aime24,0.5\nr,2,aime24,nan\n")
    assert plot_main(["--summary", str(f), "--out", str(tmp_path / "p")]) == 2
    err = capsys.readouterr().err
    assert "line 3" in err and "np.float64" not in err and "NaN" in err, err


def test_one_colour_per_method_in_every_figure(tmp_path: Path, monkeypatch) -> None:
    """Training curves and the eval plot meet the methods in other orders (TensorBoard: A then B;
    summary.csv: b then a): each method keeps one colour."""
    from rpg_eval.report import plots as P
    from torch.utils.tensorboard import SummaryWriter

    for name, scale in (("A", 1.0), ("B", 0.5)):
        w = SummaryWriter(log_dir=str(tmp_path / "tb" / name))
        for s in range(1, 6):
            w.add_scalar("train/reward", scale * s, s)
        w.close()
    summary = tmp_path / "summary.csv"
    summary.write_text(
        "run,step,benchmark,mean\nb,1,aime24,0.1\nb,2,aime24,0.2\na,1,aime24,0.3\na,2,aime24,0.4\n"
    )
    figures = []
    monkeypatch.setattr(P, "_save", lambda fig, out, name, formats, dpi: figures.append((name, fig)) or [])
    rc = P.main(["--tb", f"A={tmp_path / 'tb' / 'A'}", f"B={tmp_path / 'tb' / 'B'}", "--summary",
                 str(summary), "--label", "a=A", "--label", "b=B", "--panels", "reward", "--out", str(tmp_path / "p")])  # fmt: skip
    assert rc == 0
    seen: dict[str, set] = {"A": set(), "B": set()}
    kinds = set()
    for base, fig in figures:
        for ax in fig.axes:
            for line in ax.get_lines():
                method = line.get_label().split(":")[0]  # "A" or, on a panel of several metrics, "A: reward"
                if method in seen:
                    seen[method].add(line.get_color())
                    kinds.add(base)
    assert {"overlay_reward", "eval"} <= kinds, kinds
    assert len(seen["A"]) == 1 and len(seen["B"]) == 1 and seen["A"] != seen["B"], seen


def test_the_default_paper_file_is_the_repositorys_wherever_the_command_runs(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    from rpg_eval.report.tables import main as table_main

    # a results/paper/paper_tables.csv of the current directory (another project's) is not read
    (tmp_path / "results" / "paper").mkdir(parents=True)
    (tmp_path / "results" / "paper" / "paper_tables.csv").write_text("not,the,paper\n1,2,3\n")
    monkeypatch.chdir(tmp_path)
    assert table_main(["--table", "T3"]) == 0
    repo_rows = list(csv.DictReader((REPO / "results" / "paper" / "paper_tables.csv").open()))
    t3 = next(r for r in repo_rows if r["table"] == "T3")
    assert f"{float(t3['last']):.4f}" in capsys.readouterr().out


# --------------------------------------------------------------------------- one real run, resumed wrongly


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A real run (1 tiny checkpoint, AIME24 x 2 problems x 2 samples, --allow-fallback on), made
    after a failed attempt into the same directory with other settings (no records)."""
    import torch
    from rpg_eval.cli import _main

    from rpg_openrlhf.tinymodel import build_tiny_model

    root = tmp_path_factory.mktemp("hostile")
    ckpts = root / "ckpts"
    build_tiny_model(ckpts / "global_step10_hf", seed=0)
    broken = _model_dirs(root / "broken", ["global_step10_hf"])
    out = root / "run"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with pytest.raises(Exception):  # noqa: B017 - the model cannot load: any error (--debug semantics)
            _main(["run", "--checkpoints", str(broken), "--out", str(out), "--data-dir", str(DATA), *RUN_ARGS,
                   "--temperature", "0.5"])  # fmt: skip
        assert (out / "run.json").is_file() and not (out / "samples.jsonl").exists()
        assert cli_main(["run", "--checkpoints", str(ckpts), "--out", str(out), "--data-dir", str(DATA), *RUN_ARGS,
                         "--allow-fallback", "--run", "tiny"]) == 0  # fmt: skip
    finally:
        torch.set_num_threads(threads)
    return {"root": root, "ckpts": ckpts, "out": out}


def _copy(made: dict[str, Path], tmp_path: Path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(made["out"], out)
    return out


def _resume(made: dict[str, Path], out: Path, *extra: str, ckpts: Path | None = None) -> int:
    args = ["run", "--checkpoints", str(ckpts or made["ckpts"]), "--out", str(out), *RUN_ARGS,
            "--run", "tiny"]  # fmt: skip
    if "--data" not in extra:
        args += ["--data-dir", str(DATA)]
    return cli_main([*args, *extra])


@pytest.mark.slow
def test_failed_run_without_records_does_not_block_the_corrected_one_which_resumes(
    made: dict[str, Path], tmp_path: Path, capsys
) -> None:
    """The positive control: the corrected run's records are there; same settings, the same data named
    differently and a copy of the same checkpoint elsewhere resume (nothing to do), loading no model."""
    lines = (made["out"] / "samples.jsonl").read_text().splitlines()
    assert len(lines) == 4
    assert {json.loads(x)["sampling"]["temperature"] for x in lines} == {1.0}
    # response_tokens counts the ids generated, not the decoded text encoded again (that said 5-10
    # at --max-tokens 4; the count itself: test_generated_count_cuts_at_the_end_and_at_a_stop_string)
    tokens = [json.loads(x)["response_tokens"] for x in lines]
    assert all(1 <= t <= 4 for t in tokens) and 4 in tokens, tokens  # a random model mostly runs to the limit
    out = _copy(made, tmp_path)
    before = (out / "samples.jsonl").read_bytes()
    moved = tmp_path / "moved"
    shutil.copytree(made["ckpts"], moved)
    rc = _resume(made, out, "--allow-fallback", "--data", f"aime24={DATA / 'aime24.jsonl'}", ckpts=moved)
    assert rc == 0 and "0 new records" in capsys.readouterr().out
    assert (out / "samples.jsonl").read_bytes() == before


def test_generated_count_cuts_at_the_end_and_at_a_stop_string() -> None:
    """``response_tokens`` is the number of token ids generated (issue 50 item 3), not the decoded text
    encoded again: the report's "truncated" filter marked responses that had ended early."""
    from rpg_eval.run.lm_models import generated_count

    decode = "".join  # one character per token id
    assert generated_count(list("abcd"), {"\x00"}, decode, []) == 4  # ran to the limit
    assert generated_count(list("ab\x00\x00"), {"\x00"}, decode, []) == 3  # EOS counted, padding not
    assert generated_count(list("a\n\nbcd"), set(), decode, ["\n\n"]) == 3  # the batch went on after the stop
    assert generated_count(list("abcd"), set(), decode, ["zz", ""]) == 4


@pytest.mark.slow
@pytest.mark.parametrize("change", ["data", "checkpoint", "record", "foreign line"])
def test_a_resume_that_would_mix_records_is_refused(
    made: dict[str, Path], tmp_path: Path, capsys, change: str
) -> None:
    """Other data under the same ids, another checkpoint under the same name, a record that disagrees
    with its run.json (n = 3 under n = 2), a line that is no record: refused naming it (run.json's
    paths are relative), nothing in --out changed."""
    out = _copy(made, tmp_path)
    samples = out / "samples.jsonl"
    extra: list[str] = []
    ckpts = None
    if change == "data":
        rows = [json.loads(x) for x in (DATA / "aime24.jsonl").read_text().splitlines() if x.strip()]
        swapped = tmp_path / "aime24_other.jsonl"
        swapped.write_text(
            "".join(
                json.dumps({**r, "problem": r["problem"] + " (edited)", "answer": "7"}) + "\n" for r in rows
            )
        )
        extra = ["--data", f"aime24={swapped}"]
        named = ["data of aime24", os.path.relpath(swapped, out)]
    elif change == "checkpoint":
        from rpg_openrlhf.tinymodel import build_tiny_model

        ckpts = tmp_path / "other_run"
        build_tiny_model(ckpts / "global_step10_hf", seed=1)  # another model, same directory name
        named = ["checkpoint global_step10_hf", os.path.relpath(ckpts, out)]
    elif change == "record":
        lines = samples.read_text().splitlines()
        r = json.loads(lines[2])
        r["sampling"]["n"] = 3
        lines[2] = json.dumps(r, sort_keys=True)
        samples.write_text("\n".join(lines) + "\n")
        named = [f"{samples}:3", "sampling.n 3"]
    else:
        with samples.open("a") as f:
            f.write("my notes about this run\n")
        named = [f"{samples}:5", "not a record"]
    before = _files(out)
    assert _resume(made, out, "--allow-fallback", *extra, ckpts=ckpts) == 2
    line = _error_line(capsys.readouterr().err)
    assert all(n in line for n in named), (named, line)
    assert _files(out) == before
