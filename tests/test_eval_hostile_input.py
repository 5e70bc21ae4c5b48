"""Careless and hostile input to rpg-eval (issue #14): nothing lost, nothing mixed, one clear line.

A resume that would mix records refuses naming what changed; summaries count each key once; numeric
options are checked before anything is written; a failure is one line, exit 2. The slow tests share
one real run (tiny checkpoint, lm-eval hf backend) and resume copies of it with one thing changed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from rpg_eval.cli import main as cli_main

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"
RUN_ARGS = ["--benchmarks", "aime24", "--backend", "hf", "--device", "cpu", "--limit", "2", "--n", "2",
            "--max-tokens", "4", "--chunk", "2", "--no-summary"]  # fmt: skip


def _error_line(err: str, prog: str = "rpg-eval") -> str:
    """The single error line (warnings from libraries aside); fails if there is not exactly one."""
    lines = [x for x in err.splitlines() if x.strip()]
    errors = [x for x in lines if x.startswith(f"{prog}: error:") or x.startswith(f"{prog} ")]
    assert len(errors) == 1 and "Traceback" not in err, err
    return errors[0]


def _fake_ckpt(root: Path, name: str = "global_step10_hf") -> Path:
    """A directory find_checkpoints accepts (config.json) but no model can be loaded from."""
    d = root / name
    d.mkdir(parents=True)
    (d / "config.json").write_text("{}")
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
    ckpts = _fake_ckpt(tmp_path / "c")
    cases = [
        (["--checkpoints", str(tmp_path / "missing"), "--data-dir", str(DATA)], "missing"),
        (["--checkpoints", str(ckpts), "--data", f"aime24={tmp_path / 'none.jsonl'}"], "none.jsonl"),
        (["--checkpoints", str(ckpts), "--data-dir", str(DATA), "--benchmarks", "nope"], "nope"),
    ]
    for args, named in cases:
        rc = cli_main(["run", "--out", str(tmp_path / "o"), *RUN_ARGS, *args])
        assert rc == 2 and named in _error_line(capsys.readouterr().err), args


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


# --------------------------------------------------------------------------- one real run, resumed wrongly


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A real run (1 tiny checkpoint, AIME24 x 2 problems x 2 samples, --allow-fallback on), made
    after a failed attempt into the same directory with other settings (no records)."""
    import torch

    from rpg_openrlhf.tinymodel import build_tiny_model

    root = tmp_path_factory.mktemp("hostile")
    ckpts = root / "ckpts"
    build_tiny_model(ckpts / "global_step10_hf", seed=0)
    broken = _fake_ckpt(root / "broken")
    out = root / "run"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with pytest.raises(Exception):  # noqa: B017 - the model cannot load: any error
            cli_main_raw(["run", "--checkpoints", str(broken), "--out", str(out), "--data-dir", str(DATA), *RUN_ARGS,
                          "--temperature", "0.5"])  # fmt: skip
        assert (out / "run.json").is_file() and not (out / "samples.jsonl").exists()
        assert cli_main(["run", "--checkpoints", str(ckpts), "--out", str(out), "--data-dir", str(DATA), *RUN_ARGS,
                         "--allow-fallback", "--run", "tiny"]) == 0  # fmt: skip
    finally:
        torch.set_num_threads(threads)
    return {"root": root, "ckpts": ckpts, "out": out}


def cli_main_raw(argv: list[str]) -> int:
    """rpg-eval with --debug semantics: the exception itself, not the error line."""
    from rpg_eval.cli import _main

    return _main(argv)


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
    # at --max-tokens 4; the count itself: tests/test_eval_response_tokens.py)
    tokens = [json.loads(x)["response_tokens"] for x in lines]
    assert all(1 <= t <= 4 for t in tokens) and 4 in tokens, tokens  # a random model mostly runs to the limit
    out = _copy(made, tmp_path)
    before = (out / "samples.jsonl").read_bytes()
    moved = tmp_path / "moved"
    shutil.copytree(made["ckpts"], moved)
    rc = _resume(made, out, "--allow-fallback", "--data", f"aime24={DATA / 'aime24.jsonl'}", ckpts=moved)
    assert rc == 0 and "0 new records" in capsys.readouterr().out
    assert (out / "samples.jsonl").read_bytes() == before


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
