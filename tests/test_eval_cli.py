"""The rpg-eval command line (rpg_eval.cli, rpg_openrlhf.common.cliutil): issue #19 item 5 (a bound
on --n, nothing left on refusal) and what users see: one line per error without a usage block, no
prefix matching, no library warning before the error, outputs with the mode open() gives,
--device / --model-arg device / --data NAME / --max-tokens checked before anything is written, and a
checkpoint that does not load named in one line (issue #19 item 8)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rpg_eval.cli import main as cli_main

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"
RUN = ["--benchmarks", "aime24", "--backend", "hf", "--limit", "1", "--n", "1", "--max-tokens", "4",
       "--no-summary", "--data-dir", str(DATA)]  # fmt: skip


def _lines(err: str) -> list[str]:
    return [x for x in err.splitlines() if x.strip()]


def _run(tmp_path: Path, *extra: str) -> list[str]:
    ckpt = tmp_path / "c" / "global_step10_hf"
    ckpt.mkdir(parents=True)
    (ckpt / "config.json").write_text('{"max_position_embeddings": 4096}')  # no model_type: does not load
    return ["run", "--checkpoints", str(ckpt.parent), "--out", str(tmp_path / "o"), *RUN, *extra]


@pytest.mark.parametrize(
    "argv",
    [["run", "--n", "0"], ["summarize", "x", "--iters", "1000000000"], ["score", "x", "--timeout", "1e10"],
     ["plot", "--dpi", "100000"], ["plot", "--smooth", "1"], ["table", "--formats"]]
)  # fmt: skip
def test_usage_errors_are_one_line(capsys, argv: list[str]) -> None:
    """A parse error printed a 10-line usage block before the error line."""
    assert cli_main(argv) == 2
    (line,) = _lines(capsys.readouterr().err)
    assert line.startswith(f"rpg-eval {argv[0]}: error:") or line.startswith("rpg-eval: error:"), line
    assert next(a for a in argv if a.startswith("--")) in line, line  # names the flag


@pytest.mark.parametrize("argv", [["run", "--temp", "0.5"], ["plot", "--smo", "0.5"]])
def test_option_prefixes_are_not_options(tmp_path: Path, capsys, argv: list[str]) -> None:
    """argparse prefix matching made `--temp 0.5` mean `--temperature 0.5`: a typo must not be a flag."""
    full = _run(tmp_path, *argv[1:]) if argv[0] == "run" else argv
    assert cli_main(full) == 2
    (line,) = _lines(capsys.readouterr().err)
    typo = next(a for a in argv if a.startswith("--"))
    assert "unrecognized arguments" in line and typo in line
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    ("extra", "named"),
    [(["--device", "tpu9"], "--device"), (["--device", "cuda:7"], "--device cuda:7: this machine has"), (["--model-arg", "device=cuda:7"], "--model-arg device"),
     (["--model-arg", "batch_size=1"], "--model-arg batch_size"),
     (["--data", f"aime25={DATA / 'aime25.jsonl'}"], "--data aime25"), (["--temperature", "1e-308"], "--temperature"),
     (["--n", "1000000000"], "--n"), (["--max-tokens", "5000"], "global_step10_hf: --max-tokens 5000 does not fit its 4096")]
)  # fmt: skip
def test_settings_checked_before_anything_is_written(
    tmp_path: Path, capsys, extra: list[str], named: str
) -> None:
    """`--device tpu9`, `--model-arg device=cuda:7` were accepted silently; `--model-arg batch_size=1`
    or `pretrained=...` gave "TypeError: multiple values for keyword argument"; a `--data NAME=FILE`
    whose NAME is not in --benchmarks was ignored; `--temperature 1e-308` made torch's sampling
    probabilities inf/nan; `--n 1000000000` grew to ~22 GB and was killed by the kernel, leaving
    run.json and tasks/; `--max-tokens 5000` on a 4,096-position model was an AssertionError in lm-eval."""
    assert cli_main(_run(tmp_path, *extra)) == 2
    (line,) = _lines(capsys.readouterr().err)
    assert named in line, line
    assert not (tmp_path / "o").exists()


def test_no_library_warning_before_the_error(tmp_path: Path) -> None:
    """The real console entry point: a model that does not load is one line on stderr (torch's
    pynvml FutureWarning was printed before it)."""
    cmd = [sys.executable, "-m", "rpg_eval.cli", *_run(tmp_path)]
    env = {**os.environ, "PYTHONWARNINGS": "default"}
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    lines = [x for x in _lines(res.stderr) if not x.startswith("[rpg-eval]")]
    assert res.returncode == 2 and len(lines) == 1 and lines[0].startswith("rpg-eval: error:"), res.stderr
    assert "global_step10_hf" in lines[0] and "does not load" in lines[0]  # names the checkpoint (item 8)
    assert not (tmp_path / "o" / "samples.jsonl").exists()


# Every command but `run` works without lm-eval and torch, and so do --help and a usage error of any
# (issue #40 item 2: they answer at once); each command below runs for real in one process, under
# umask 022: summary.csv, last_best.csv, disagreements.json and score's output were 0600 (tempfile's).
NOT_LOADED = """
import json, os, sys
os.umask(0o022)
from pathlib import Path
from rpg_eval.cli import main
heavy = ("torch", "lm_eval", "vllm", "ray", "transformers", "deepspeed")
root = Path(sys.argv[1])
loaded = {}
for argv in json.loads(sys.argv[2]):
    try:
        main(argv)
    except SystemExit:
        pass
    loaded[" ".join(argv[:2])] = sorted(m for m in heavy if m in sys.modules)
print(json.dumps(loaded))
"""


def test_commands_other_than_run_do_not_import_lm_eval_or_torch(tmp_path: Path) -> None:
    from test_eval_compare import A, B, write_run

    a, b = write_run(tmp_path / "a", "rpg", A), write_run(tmp_path / "b", "grpo", B)
    argvs = [
        ["--help"],
        ["run", "--temperature", "-1"],  # a usage error of the one command that needs them
        ["run", "--help"],
        ["summarize", str(a), str(b), "--out", str(tmp_path / "s"), "--iters", "50"],
        ["score", str(a / "samples.jsonl"), "--out", str(tmp_path / "scored.jsonl")],
        ["compare", str(a), str(b), "--iters", "50"],
        ["table", "--layout", str(REPO / "eval" / "report" / "tables" / "tables.yaml"), "--table", "T3"],
        ["plot", "--summary", str(tmp_path / "s" / "summary.csv"), "--out", str(tmp_path / "p")],
        ["report", str(tmp_path / "r.html"), "--runs", str(a), str(b), "--iters", "50"],
    ]
    done = subprocess.run(
        [sys.executable, "-c", NOT_LOADED, str(tmp_path), json.dumps(argvs)],
        capture_output=True, text=True, timeout=300, cwd=REPO
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert loaded == {" ".join(argv[:2]): [] for argv in argvs}, loaded
    assert (tmp_path / "r.html").is_file() and (tmp_path / "p" / "eval.png").is_file()
    written = [tmp_path / "s" / n for n in ("summary.csv", "last_best.csv", "disagreements.json")]
    for path in [*written, tmp_path / "scored.jsonl"]:
        assert path.stat().st_mode & 0o777 == 0o644, path
