"""Security of the eval package and the reward file: model output is text, never code; user-given names cannot escape --out.

* The reward file (--reward.remote_url) and the lm-eval task code grade responses that carry
  Python payloads (``__import__('os').system(...)``, exec, eval): no side effect happens.
* A static check (AST, not grep, so comments and ``.eval()`` methods do not count): no call of
  eval / exec / compile / __import__, no pickle, unsafe yaml.load, sympify / parse_expr or
  shell=True in rpg_openrlhf/plugin/reward.py and the eval package.
* A pickle planted in a node-check report (``sync/*.pt``) is refused, never run (no pickle is
  loaded from disk: ``weights_only=True``).
* Names that come from users (run names, checkpoint names, table ids) with ``../`` do not make
  the tools write outside the chosen output directory.
"""

from __future__ import annotations

import ast
import json
import os
import threading
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _payloads(marker: Path) -> list[str]:
    cmd = f"touch {marker}"
    return [
        f"Answer: __import__('os').system('{cmd}')",
        f"\\boxed{{__import__('os').system('{cmd}')}}",
        f"Answer: ${{__import__('os').system('{cmd}')}}$",
        f"Answer: exec(\"import os; os.system('{cmd}')\")",
        f"\\boxed{{eval(\"__import__('os').system('{cmd}')\")}}",
        f"The final answer is {{{{ __import__('subprocess').call(['touch', '{marker}']) }}}}",
        f"Answer: (lambda: __import__('os').system('{cmd}'))()",
        f"\\boxed{{Symbol('x').__class__.__init__.__globals__['os'].system('{cmd}')}}",
        f"Answer: open('{marker}', 'w').write('x')",
        f"Answer: __builtins__.__dict__['exec'](\"open('{marker}','w')\")",
    ]


def _verdicts(consumer: str, responses: list[str], monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Whether ``consumer`` took each response for a right answer to "What is 2+2?" (gold 4)."""
    n = len(responses)
    if consumer.startswith("reward"):  # the reward file: --reward.remote_url
        from rpg_openrlhf.plugin import reward

        grader = "paper" if consumer == "reward-paper" else "math_verify"
        monkeypatch.setenv(reward.GRADER_ENV, grader)
        prompts = ["What is 2+2? "] * n
        queries = [q + r + "<|im_end|>" for q, r in zip(prompts, responses)]
        result: dict = {}
        # OpenRLHF calls it from a worker thread too: the grader then uses its process pool
        t = threading.Thread(
            target=lambda: result.update(out=reward.reward_func(queries, prompts, ["4"] * n))
        )
        if consumer == "reward-in-a-thread":
            t.start()
            t.join(timeout=120)
        else:
            t.run()  # in this thread
        out = result["out"]
        assert out["rewards"].shape == (n,)
        return [x != reward.WRONG_REWARD[grader] for x in out["rewards"].tolist()]
    if consumer == "lm-eval-task":
        from rpg_eval.run.tasks import utils

        res = utils.process_results({"answer": "4", "id": "x"}, [responses])
        return [res["mean_at_k"] != 0.0, *json.loads(res["verdicts"])["math_verify"]]
    from rpg_eval.graders import grade, grade_many

    got = [grade(r, "4", grader=g).correct for r in responses for g in ("math_verify", "paper")]
    got += [grade(r, "4", allow_fallback=True).correct for r in responses]
    return got + [v.correct for v in grade_many(responses, ["4"] * n, processes=1, allow_fallback=True)]


@pytest.mark.parametrize("consumer", ["reward-math_verify", "reward-paper", "reward-in-a-thread", "lm-eval-task", "graders"])  # fmt: skip
def test_model_output_is_graded_as_text_never_run(tmp_path: Path, monkeypatch, consumer: str) -> None:
    marker = tmp_path / "pwned"
    responses = _payloads(marker)
    verdicts = _verdicts(consumer, responses, monkeypatch)
    assert not marker.exists(), "grading a response executed code from it"
    assert len(verdicts) >= len(responses) and not any(verdicts), verdicts


# --------------------------------------------------------------------------- static check

DANGEROUS_CALLS = {"eval", "exec", "compile", "__import__", "sympify", "parse_expr", "literal_eval_unsafe"}
DANGEROUS_ATTRS = {("pickle", "load"), ("pickle", "loads"), ("marshal", "loads"), ("builtins", "eval"),
                   ("builtins", "exec"), ("os", "system"), ("os", "popen")}  # fmt: skip


def _untrusted_sources() -> list[Path]:
    files = [REPO / "rpg_openrlhf" / "plugin" / "reward.py"]
    files += sorted((REPO / "eval").rglob("*.py"))
    return [f for f in files if f.is_file()]


def _findings(path: Path, root: Path = REPO) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        where = f"{path.relative_to(root)}:{node.lineno}"
        if isinstance(f, ast.Name) and f.id in DANGEROUS_CALLS:
            found.append(f"{where}: {f.id}(...)")
        elif isinstance(f, ast.Attribute):
            base = f.value.id if isinstance(f.value, ast.Name) else None
            # x.eval() without arguments is torch's Module.eval(): not a code path
            if f.attr in DANGEROUS_CALLS - {"compile"} and (node.args or f.attr not in ("eval", "exec")):
                found.append(f"{where}: .{f.attr}(...)")
            if (base, f.attr) in DANGEROUS_ATTRS:
                found.append(f"{where}: {base}.{f.attr}(...)")
            if base == "yaml" and f.attr == "load":
                loader = {k.arg: k.value for k in node.keywords}.get("Loader")
                if not (isinstance(loader, ast.Attribute) and "Safe" in loader.attr):
                    found.append(f"{where}: yaml.load without a SafeLoader")
        for kw in node.keywords:
            if kw.arg == "shell" and isinstance(kw.value, ast.Constant) and kw.value.value is True:
                found.append(f"{where}: shell=True")
    return found


def test_no_eval_or_exec_on_untrusted_strings() -> None:
    files = _untrusted_sources()
    assert any(f.name == "reward.py" for f in files) and any(f.parent.name == "graders" for f in files)
    findings = [x for f in files for x in _findings(f)]
    assert not findings, "code paths that could execute model output:\n" + "\n".join(findings)


def test_static_check_catches_what_it_claims(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import pickle, yaml\nx = eval(s)\nexec(s)\npickle.loads(b)\nyaml.load(t)\nm.eval()\n")
    got = _findings(bad, tmp_path)
    assert len(got) == 4  # m.eval() (a model method) is not a finding


# --------------------------------------------------------------------------- paths


def _files_under(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if p.is_file()}


def test_summary_with_hostile_run_and_checkpoint_names_stays_in_out(tmp_path: Path) -> None:
    from rpg_eval import records as rec
    from rpg_eval.stats.summary import summarize

    out = tmp_path / "a" / "b" / "out"
    out.mkdir(parents=True)
    samples = out / "samples.jsonl"
    base = {"benchmark": "aime24", "gold": "1", "prompt_style": "boxed", "problem_index": 0, "seed": 0,
            "extracted": {"math_verify": "1", "paper": None}, "error_math_verify": None,
            "sampling": {"n": 2}, "response": "\\boxed{1}", "task": "rpg_aime24"}  # fmt: skip
    recs = [
        {**base, "run": "../../../escaped_run", "checkpoint": f"../../escaped_ckpt{s}", "checkpoint_path": "/x",
         "step": s, "problem_id": "p1", "sample_index": j, "correct": {"math_verify": j == 0, "paper": False}}
        for s in (1, 2) for j in (0, 1)
    ]  # fmt: skip
    rec.append(samples, recs)
    before = _files_under(tmp_path)
    summarize([samples], out, iters=10)
    new = _files_under(tmp_path) - before
    assert new, "summarize wrote nothing"
    outside = [p for p in new if out.resolve() not in p.resolve().parents]
    assert not outside, f"written outside --out: {outside}"


def test_plot_run_name_with_dotdot_stays_in_out(tmp_path: Path) -> None:
    import pandas as pd
    from rpg_eval.report.plots import plot_run

    out = tmp_path / "x" / "plots"
    scalars = {"train/reward": pd.DataFrame({"step": [1, 2, 3], "value": [0.3, 0.2, 0.1]})}
    res = plot_run("../../../escaped", scalars, out, formats=("png",))
    assert len(res.paths) == 1
    (png,) = res.paths
    assert Path(png).parent.resolve() == out.resolve()  # directly in --out
    assert (
        "escaped" in Path(png).name and Path(png).suffix == ".png"
    )  # the run's name survives, as a file name
    assert Path(png).read_bytes().startswith(b"\x89PNG")
    written = {p for p in tmp_path.rglob("*") if p.is_file()}
    assert written == {Path(png)}, written


def test_table_id_with_dotdot_cannot_escape_out(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from rpg_eval.report.tables import main

    paper = REPO / "results" / "paper" / "paper_tables.csv"  # the committed copy of the paper's numbers
    layout = tmp_path / "layout.yaml"
    layout.write_text(
        "tables:\n  ../escaped:\n    title: x\n    paper_table: T3\n    benchmarks: [aime24]\n",
        encoding="utf-8",
    )
    out = tmp_path / "deep" / "out"
    rc = main(["--layout", str(layout), "--paper", str(paper), "--out", str(out), "--formats", "md"])
    assert rc == 2  # such an id is refused before anything is written
    assert "'../escaped'" in capsys.readouterr().err
    assert _files_under(tmp_path) == {layout}


def test_checkpoint_names_from_disk_never_become_paths(tmp_path: Path) -> None:
    """Duplicate checkpoint names are made unique as parent/name: a record key, not a path."""
    from rpg_eval.run.checkpoints import find_checkpoints

    for parent in ("runA", "runB"):
        d = tmp_path / parent / "global_step1_hf"
        d.mkdir(parents=True)
        (d / "config.json").write_text("{}")
    names = [c.name for c in find_checkpoints(str(tmp_path / "run*"))]
    assert sorted(names) == ["runA/global_step1_hf", "runB/global_step1_hf"]
    assert all(".." not in n and not os.path.isabs(n) for n in names)


class _Planted:
    """Unpickling this calls ``open(path, "w")``: the file appears if the loader runs pickled code."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_a_planted_pickle_is_refused_not_run(tmp_path: Path) -> None:
    import subprocess
    import sys

    import torch
    from test_nodecheck import fake_run

    run = fake_run(tmp_path / "run")
    created = tmp_path / "created-by-the-pickle"
    torch.save({"sync": 9, "actor": [_Planted(created)], "engines": []}, run / "sync" / "sync_00009.pt")
    proc = subprocess.run([sys.executable, "-m", "rpg_openrlhf.nodecheck", "--report", str(run)], cwd=REPO,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("rpg-nodecheck: error: "), (
        proc.stderr
    )
    assert not created.exists(), "the planted pickle ran"
    assert (
        "sync_00009.pt" in lines[0] and "weights_only" not in lines[0]
    )  # not torch's advice to load it anyway
