"""Untrusted content (docs/contracts.md, "Threat model"): model output is text, never code; no pickle is
loaded from disk (guarantee 5); names from records and layouts do not make a command write outside --out.

* The reward file (--reward.remote_url), the lm-eval task code and the graders grade responses that
  carry Python payloads (``__import__('os').system(...)``, exec, eval): no side effect happens.
* A static check (AST, so comments and torch's ``.eval()`` do not count): no eval / exec / compile /
  __import__, pickle, unsafe yaml.load, sympify / parse_expr or shell=True in reward.py and eval/.
* A pickle planted in a node-check report (``sync/*.pt``) is refused, never run (``weights_only=True``).
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _verdicts(consumer: str, responses: list[str], monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Whether ``consumer`` took each response for a right answer to "What is 2+2?" (gold 4)."""
    n = len(responses)
    if consumer.startswith("reward"):  # the reward file: --reward.remote_url
        from rpg_openrlhf.plugin import reward

        grader = consumer.split("-")[1]
        monkeypatch.setenv(reward.GRADER_ENV, grader)
        q = "What is 2+2? "
        out = reward.reward_func([f"{q}{r}<|im_end|>" for r in responses], [q] * n, ["4"] * n)
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


@pytest.mark.parametrize("consumer", ["reward-math_verify", "reward-paper", "lm-eval-task", "graders"])
def test_model_output_is_graded_as_text_never_run(tmp_path: Path, monkeypatch, consumer: str) -> None:
    marker, cmd = tmp_path / "pwned", f"touch {tmp_path / 'pwned'}"
    responses = [
        f"Answer: __import__('os').system('{cmd}')",
        f"\\boxed{{__import__('os').system('{cmd}')}}",
        f"Answer: exec(\"import os; os.system('{cmd}')\")",
        f"\\boxed{{eval(\"__import__('os').system('{cmd}')\")}}",
        f"The final answer is {{{{ __import__('subprocess').call(['touch', '{marker}']) }}}}",
        f"\\boxed{{Symbol('x').__class__.__init__.__globals__['os'].system('{cmd}')}}",
        f"Answer: open('{marker}', 'w').write('x')",
    ]
    verdicts = _verdicts(consumer, responses, monkeypatch)
    assert not marker.exists(), "grading a response executed code from it"
    assert len(verdicts) >= len(responses) and not any(verdicts), verdicts


DANGEROUS_CALLS = {"eval", "exec", "compile", "__import__", "sympify", "parse_expr"}
DANGEROUS_ATTRS = {("pickle", "load"), ("pickle", "loads"), ("marshal", "loads"), ("builtins", "eval"),
                   ("builtins", "exec"), ("os", "system"), ("os", "popen")}  # fmt: skip


def _findings(path: Path, root: Path = REPO) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if not isinstance(node, ast.Call):
            continue
        f, where = node.func, f"{path.relative_to(root)}:{node.lineno}"
        if isinstance(f, ast.Name) and f.id in DANGEROUS_CALLS:
            found.append(f"{where}: {f.id}(...)")
        elif isinstance(f, ast.Attribute):
            base = f.value.id if isinstance(f.value, ast.Name) else None
            # x.eval() without arguments is torch's Module.eval(): not a code path
            if f.attr in DANGEROUS_CALLS - {"compile"} and (node.args or f.attr not in ("eval", "exec")):
                found.append(f"{where}: .{f.attr}(...)")
            if (base, f.attr) in DANGEROUS_ATTRS:
                found.append(f"{where}: {base}.{f.attr}(...)")
            loader = getattr({k.arg: k.value for k in node.keywords}.get("Loader"), "attr", "")
            if base == "yaml" and f.attr == "load" and "Safe" not in loader:
                found.append(f"{where}: yaml.load without a SafeLoader")
        if any(k.arg == "shell" and getattr(k.value, "value", None) is True for k in node.keywords):
            found.append(f"{where}: shell=True")
    return found


def test_no_eval_or_exec_on_untrusted_strings(tmp_path: Path) -> None:
    files = [REPO / "rpg_openrlhf" / "plugin" / "reward.py", *sorted((REPO / "eval").rglob("*.py"))]
    assert files[0].is_file() and any(f.parent.name == "graders" for f in files)
    findings = [x for f in files for x in _findings(f)]
    assert not findings, "code paths that could execute model output:\n" + "\n".join(findings)
    bad = tmp_path / "bad.py"  # the check can fail: each of these is found, a model's .eval() is not
    bad.write_text(
        "import pickle, yaml\nx = eval(s)\nexec(s)\npickle.loads(b)\nyaml.load(t)\nm.eval()\nrun(c, shell=True)\n"
    )
    assert len(_findings(bad, tmp_path)) == 5


def test_names_from_records_and_plots_stay_in_out(tmp_path: Path) -> None:
    """Run and checkpoint names with ``../`` (records from elsewhere) become keys or file names in --out."""
    import pandas as pd
    from rpg_eval import records as rec
    from rpg_eval.report.plots import plot_run
    from rpg_eval.stats.summary import summarize

    out = tmp_path / "a" / "b" / "out"
    out.mkdir(parents=True)
    base = {"benchmark": "aime24", "gold": "1", "prompt_style": "boxed", "seed": 0, "response": "\\boxed{1}",
            "extracted": {"math_verify": "1", "paper": None}, "sampling": {"n": 2}, "run": "../../../escaped_run"}  # fmt: skip
    rec.append(out / "samples.jsonl", [
        {**base, "checkpoint": f"../../escaped_ckpt{s}", "step": s, "problem_id": "p1", "sample_index": j,
         "correct": {"math_verify": j == 0, "paper": False}} for s in (1, 2) for j in (0, 1)
    ])  # fmt: skip
    summarize([out / "samples.jsonl"], out, iters=10)
    curves = {"train/reward": pd.DataFrame({"step": [1, 2], "value": [0.3, 0.1]})}
    (png,) = plot_run("../../../escaped", curves, out / "plots", formats=("png",)).paths
    assert Path(png).parent == out / "plots" and "escaped" in Path(png).name
    written = {p for p in tmp_path.rglob("*") if p.is_file()}
    assert len(written) >= 5 and all(out in p.parents for p in written), written


def test_table_id_with_dotdot_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from rpg_eval.report.tables import main

    layout = tmp_path / "layout.yaml"
    layout.write_text("tables:\n  ../escaped:\n    title: x\n    paper_table: T3\n    benchmarks: [aime24]\n")
    paper = REPO / "results" / "paper" / "paper_tables.csv"
    argv = ["--layout", str(layout), "--paper", str(paper), "--out", str(tmp_path / "out"), "--formats", "md"]
    assert main(argv) == 2
    assert "'../escaped'" in capsys.readouterr().err and {p for p in tmp_path.rglob("*")} == {layout}


class _Planted:
    """Unpickling this calls ``open(path, "w")``: the file appears if the loader runs pickled code."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.mark.parametrize("damage", ["planted pickle", "{not json", "[1, 2]", "no log"])
def test_a_planted_pickle_or_a_damaged_nodecheck_report_is_one_line(tmp_path: Path, damage: str) -> None:
    """A pickle in a node-check report is refused, never run, and not with torch's advice to load it
    anyway (``weights_only``); a damaged report is one line too (guarantee 6)."""
    import torch
    from test_io_careless import _one_error_line
    from test_nodecheck import fake_run

    run, created = fake_run(tmp_path / "run"), tmp_path / "created-by-the-pickle"
    if damage == "planted pickle":
        torch.save({"sync": 9, "actor": [_Planted(created)], "engines": []}, run / "sync" / "sync_00009.pt")
    else:
        (run / "log.txt").unlink() if damage == "no log" else (run / "run.json").write_text(damage)
    line = _one_error_line(["rpg_openrlhf.nodecheck", "--report", str(run)], "rpg-nodecheck")
    assert {"planted pickle": "sync_00009.pt", "no log": "no log.txt"}.get(damage, "run.json") in line
    assert not created.exists() and "weights_only" not in line
