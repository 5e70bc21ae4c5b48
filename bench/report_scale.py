"""How big and how fast ``rpg-eval report`` is on a large evaluation: 100,000 samples.

Writes synthetic records of two runs (5 checkpoints x 2 benchmarks x 625 problems x 8 samples each:
100,000 samples; each response ``--chars`` characters of reasoning ending in a boxed integer), builds
the page with ``rpg-eval report`` (timed in this process: wall and CPU seconds), then opens it in
headless Chromium (one browser, rpg_eval.report.browser) and reads the page's own clock:
``readyMs`` (navigation start to the first rendering of the sample browser) and ``renderMs`` after
a filter is changed on the page. Prints one JSON object.

    .venv/bin/python bench/report_scale.py [--chars 3000] [--out /tmp/report-scale]
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import time
from pathlib import Path

from rpg_eval.report.browser import Chromium

WORDS = [
    "so",
    "we",
    "compute",
    "the",
    "sum",
    "of",
    "the",
    "terms",
    "and",
    "check",
    "each",
    "case",
    "then",
    "the",
    "answer",
    "follows",
    "from",
    "it",
]


def write_runs(out: Path, chars: int) -> list[Path]:
    rng = random.Random(0)
    dirs = []
    for run in ("rpg", "grpo"):
        d = out / run
        d.mkdir(parents=True, exist_ok=True)
        with (d / "samples.jsonl").open("w") as f:
            for step in (0, 10, 20, 30, 40):
                for bench in ("aime_a", "aime_b"):
                    for pid in range(625):
                        gold = str(pid % 1000)
                        for j in range(8):
                            ok = rng.random() < 0.3 + step / 200
                            answer = gold if ok else str(rng.randrange(1000))
                            text = " ".join(rng.choice(WORDS) for _ in range(chars // 5))[:chars]
                            f.write(json.dumps({
                                "run": run, "checkpoint": f"global_step{step}_hf", "checkpoint_path": "/c",
                                "step": step, "benchmark": bench, "task": "t", "problem_id": f"{bench}-{pid}",
                                "problem_index": pid, "sample_index": j, "prompt_style": "boxed",
                                "prompt_hash": "0" * 64, "gold": gold, "response": f"{text} \\boxed{{{answer}}}",
                                "extracted": {"math_verify": answer, "paper": None},
                                "correct": {"math_verify": answer == gold, "paper": False},
                                "error_math_verify": None, "seed": 0, "response_tokens": chars // 4,
                                "sampling": {"backend": "vllm", "max_tokens": 4096, "n": 8, "temperature": 1.0,
                                             "top_k": 0, "top_p": 1.0},
                            }) + "\n")  # fmt: skip
        dirs.append(d)
    return dirs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chars", type=int, default=3000, help="characters of each response")
    ap.add_argument("--out", default="/tmp/report-scale")
    a = ap.parse_args()
    out = Path(a.out)
    dirs = write_runs(out, a.chars)
    from rpg_eval.cli import main as rpg_eval

    page = out / "report.html"
    t0, c0 = time.monotonic(), resource.getrusage(resource.RUSAGE_SELF)
    assert rpg_eval(["report", str(page), "--runs", *map(str, dirs), "--baseline", "grpo"]) == 0
    c1 = resource.getrusage(resource.RUSAGE_SELF)
    result = {
        "samples": 100_000,
        "response_chars": a.chars,
        "page_mib": round(page.stat().st_size / 2**20, 1),
        "build_wall_s": round(time.monotonic() - t0, 1),
        "build_cpu_s": round(c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime, 1),
    }
    with Chromium(timeout=300) as browser:
        t0 = time.monotonic()
        browser.open(page.as_uri())
        result["chromium_load_s"] = round(time.monotonic() - t0, 2)
        result["page_ready_ms"] = float(browser.evaluate("document.body.dataset.readyMs"))
        browser.evaluate(
            "var s = document.getElementById('f-correct'); s.value = '0'; s.dispatchEvent(new Event('change'))"
        )
        result["filter_render_ms"] = float(browser.evaluate("document.body.dataset.renderMs"))
        result["matching_after_filter"] = int(
            browser.evaluate("document.getElementById('count').dataset.matching")
        )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
