"""``rpg-eval report`` (issue #41 item 5): one self-contained HTML page, opened in headless Chromium
(Debian's ``chromium``; ``make test`` installs it when missing): the table shows the runs' numbers,
each filter of the sample browser shows the samples this test counts itself from the records, model
output stays text, nothing is fetched, and a screenshot is saved. Also: a lone surrogate in a record is
read as U+FFFD (shown so, and summarize writes it), and summarize writes nothing when it fails."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from rpg_eval.cli import main as cli_main
from rpg_eval.report.browser import Chromium
from test_eval_compare import refuses

PNG = b"\x89PNG\r\n\x1a\n"
HOSTILE = '</script><img src=x onerror="document.body.dataset.pwned=1"><b>bold</b>'


def _records(run: str, shift: int) -> list[dict]:
    """2 benchmarks x 2 checkpoints x 3 problems x 4 samples, with every kind of sample the filters
    pick: right and wrong under each grader, graders disagreeing, no answer, truncated (5 tokens)."""
    out = []
    for bench in ("alpha", "beta"):
        for step in (0, 10):
            for pid in range(3):
                for j in range(4):
                    kind = (pid + j + step + shift) % 5
                    mv, paper = kind in (0, 1), kind in (0, 2)
                    answer = None if kind == 3 else ("5" if mv else "6")
                    response = HOSTILE if kind == 4 else f"so Answer: {answer}" if answer else "I do not know"
                    out.append({
                        "run": run, "checkpoint": f"global_step{step}_hf", "checkpoint_path": "/c", "step": step,
                        "benchmark": bench, "task": "t", "problem_id": f"{bench}{pid}", "problem_index": pid,
                        "sample_index": j, "prompt_style": "plain", "prompt_hash": "0" * 64, "gold": "5",
                        "response": response, "extracted": {"math_verify": answer, "paper": "5" if paper else None},
                        "correct": {"math_verify": mv, "paper": paper}, "error_math_verify": None, "seed": 0,
                        "response_tokens": 5 if kind in (1, 3) else 2,
                        "sampling": {"backend": "hf", "max_tokens": 5, "n": 4, "temperature": 1.0, "top_k": 0,
                                     "top_p": 1.0}
                    })  # fmt: skip
    return out


def _write_runs(root: Path) -> list[dict]:
    """Runs rpg and grpo under ``root``; in each, a comment opener before "<script>" (it emptied the
    sample browser) and a lone surrogate (its JSON escape, the only way a record holds one)."""
    records = []
    for run, shift in (("rpg", 0), ("grpo", 1)):
        (root / run).mkdir()
        made = _records(run, shift)
        made[0]["response"], made[1]["response"] = "Answer: 5 <!--<script>", "Answer: 6 \ud800 end"
        (root / run / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in made))
        records += made
    return records


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict]]:
    root = tmp_path_factory.mktemp("report")
    records = _write_runs(root)
    data = root / "alpha.jsonl"
    data.write_text("".join(json.dumps({"id": f"alpha{i}", "problem": f"What is {i}+5-{i}?", "answer": "5"}) + "\n"
                            for i in range(3)))  # fmt: skip
    out = root / "out" / "report.html"
    rc = cli_main(["report", str(out), "--runs", str(root / "rpg"), str(root / "grpo"), "--label", "rpg=RPG",
                   "--baseline", "grpo", "--data", f"alpha={data}", "--iters", "200", "--title", "Test report"])  # fmt: skip
    assert rc == 0
    return out, records


COUNT = "+document.getElementById('count').dataset.matching"


def test_the_page_holds_everything_it_shows(report: tuple[Path, list[dict]]) -> None:
    page = report[0].read_text()
    assert not re.search(
        r"""(?:src|href)\s*=\s*["']?(?:https?:)?//|<link\b|@import|url\(\s*["']?https?:""", page
    )
    # images inside the page; model output cannot end the data
    assert "data:image/png;base64," in page and "\\u003c/script\\u003e" in page
    assert "<!--<script>" not in page and "\\u003c!--\\u003cscript\\u003e" in page


def test_chromium_shows_the_table_and_every_filter_selects_what_it_names(
    report: tuple[Path, list[dict]], tmp_path: Path
) -> None:
    out, records = report
    url = out.as_uri()
    with Chromium() as browser:  # one browser for every view
        browser.open(url)
        assert browser.evaluate(COUNT) == len(records)
        table = browser.evaluate("document.querySelector('table.results').outerHTML")
        last = [r for r in records if (r["run"], r["benchmark"], r["step"]) == ("rpg", "alpha", 10)]
        mean = sum(r["correct"]["math_verify"] for r in last) / len(
            last
        )  # RPG's Last on alpha, by hand (4 each)
        assert "RPG" in table and "grpo" in table and f"{mean:.4f}" in table and "held-out" in table
        text = browser.evaluate("document.getElementById('sample-list').textContent")
        assert "What is 1+5-1?" in text and HOSTILE in text  # the prompt, and model output shown as text
        assert "Answer: 5 <!--<script>" in text and "Answer: 6 \ufffd end" in text
        assert browser.evaluate("document.body.dataset.pwned") is None
        assert "<b>bold</b>" not in browser.evaluate("document.getElementById('sample-list').innerHTML")
        views = {
            "bench=1&correct=0": lambda r: r["benchmark"] == "beta" and not r["correct"]["math_verify"],
            "disagree=1&truncated=1": lambda r: (
                r["correct"]["math_verify"] != r["correct"]["paper"] and r["response_tokens"] >= 5
            ),
            "grader=paper&noanswer=1&ckpt=1": lambda r: (
                r["extracted"]["paper"] is None and (r["run"], r["step"]) == ("rpg", 10)
            ),
        }
        for query, pick in views.items():
            want = sum(map(pick, records))
            assert 0 < want < len(records), query
            browser.open(f"{url}?{query}")
            assert browser.evaluate(COUNT) == want, query
        # a filter chosen on the page (not in the address) changes what is shown, and the address follows it
        browser.open(url)
        browser.evaluate("var s = document.getElementById('f-correct'); s.value = '1'; "
                         "s.dispatchEvent(new Event('change'))")  # fmt: skip
        right = sum(r["correct"]["math_verify"] for r in records)
        assert browser.evaluate(COUNT) == right and browser.evaluate("location.search") == "?correct=1"
        shot = browser.screenshot(tmp_path / "report.png", 1280, 1600)
    assert shot.read_bytes().startswith(PNG) and shot.stat().st_size > 20_000


def test_report_refuses_bad_input_in_one_line(
    report: tuple[Path, list[dict]], tmp_path: Path, capsys
) -> None:
    argv = [
        "report",
        str(tmp_path / "r.html"),
        "--runs",
        str(report[0].parents[1] / "rpg"),
        "--baseline",
        "nope",
    ]
    said = "rpg-eval report: error: --baseline nope: not a run of --runs (runs: rpg)"
    assert refuses(capsys, argv, said, tmp_path) == said


def test_summarize_reads_a_lone_surrogate_as_a_replacement_character(tmp_path: Path) -> None:
    _write_runs(tmp_path)
    assert cli_main(["summarize", str(tmp_path / "rpg"), "--out", str(tmp_path / "sum")]) == 0
    dis = json.loads((tmp_path / "sum" / "disagreements.json").read_text(encoding="utf-8"))
    tails = [e["response_tail"] for k in ("examples_math_verify_only", "examples_paper_only") for e in dis[k]]
    assert "Answer: 6 \ufffd end" in tails, tails


def test_a_failing_summarize_leaves_no_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """The third output cannot be made (here: a value JSON cannot write): before, summary.csv and
    last_best.csv were already in place behind the exit 2."""
    from rpg_eval.stats import summary

    _write_runs(tmp_path)
    monkeypatch.setattr(summary, "disagreements", lambda records: {"n": {1, 2}})
    assert cli_main(["summarize", str(tmp_path / "rpg"), "--out", str(tmp_path / "sum")]) == 2
    assert "rpg-eval" in capsys.readouterr().err
    assert not any(p.name.endswith((".csv", ".json")) for p in (tmp_path / "sum").glob("*"))
