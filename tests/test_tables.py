"""rpg_eval.report.tables: the paper's tables regenerated cell for cell, ranking marks, user runs beside them."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from rpg_eval.report import tables as T
from test_eval_compare import enumerated_p, refuses, write_run

ROOT = Path(__file__).resolve().parents[1]
PAPER_CSV = ROOT / "results" / "paper" / "paper_tables.csv"
REFERENCE_CSV = ROOT.parent / "shared" / "reference" / "paper_tables.csv"

LAST_BEST_HEADER = ["run", "benchmark", "grader", "last", "last_step", "last_ci_low", "last_ci_high", "best",
                    "best_step", "best_ci_low", "best_ci_high"]  # fmt: skip


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _write_csv(path: Path, header: list[str], rows: list[list[object]]) -> Path:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    return path


@pytest.fixture(scope="module")
def paper_tables() -> dict[str, T.BuiltTable]:
    built = T.build_tables(T.load_layout(), paper_path=PAPER_CSV)
    return {t.spec.id: t for t in built}


def _marked(t: T.BuiltTable, bench: str, key: str, mark: str) -> list[str]:
    return [r.label for r in t.rows if bench in r.cells and getattr(r.cells[bench], f"{key}_mark") == mark]


# --------------------------------------------------------------------------- the paper's numbers


def test_paper_csv_is_the_reference_normalised(tmp_path: Path) -> None:
    """results/paper/paper_tables.csv holds every number of the reference, as printed."""
    ours = _rows(PAPER_CSV)
    assert len(ours) == 90
    assert {r["table"] for r in ours} == {"T3", "T5", "T6", "T8"}
    if REFERENCE_CSV.is_file():
        ref = _rows(REFERENCE_CSV)
        assert [(r["table"], r["method"], r["benchmark"].lower(), r["last"], r["best"]) for r in ref] == [
            (r["table"], r["method"], r["benchmark"], r["last"], r["best"]) for r in ours
        ]
        # import-paper is deterministic: regenerating gives the committed file byte for byte
        T.import_paper(REFERENCE_CSV, tmp_path / "p.csv")
        assert (tmp_path / "p.csv").read_text() == PAPER_CSV.read_text()
    odd = [r for r in ours if r["note"]]
    assert [(r["table"], r["method"], r["benchmark"]) for r in odd] == [("T3", "RPG-URKL", "aime25")]


def test_tables_reproduce_the_paper_cell_for_cell(paper_tables: dict[str, T.BuiltTable]) -> None:
    expected = {(r["table"], r["method"], r["benchmark"]): (r["last"], r["best"]) for r in _rows(PAPER_CSV)}
    got = {}
    for tid, t in paper_tables.items():
        for _, r in T.to_frame(t).iterrows():
            got[(tid, r["method"], r["benchmark"])] = (r["last"], r["best"])
        md, tex = T.to_markdown(t), T.to_latex(t)
        assert all(f"{v}" in md and f"{v}" in tex for (k, *_), vs in expected.items() if k == tid for v in vs)
    assert got == expected
    # shape: rows and columns as in the paper
    assert [len(paper_tables[k].rows) for k in ("T3", "T5", "T6", "T8")] == [6, 8, 6, 12]
    assert list(paper_tables["T8"].benchmark_labels.values()) == ["AMC23", "AIME24", "AIME25"]


def test_every_mark_of_the_paper_tables(paper_tables: dict[str, T.BuiltTable]) -> None:
    """Bold: the column's highest value as printed, underline: the second highest distinct one (ties
    share it), Last and Best ranked separately: every mark enumerated here from the paper's CSV."""
    printed = _rows(PAPER_CSV)
    for tid, t in paper_tables.items():
        for b in t.benchmark_labels:
            for key in ("last", "best"):
                column = {
                    r["method"]: float(r[key]) for r in printed if (r["table"], r["benchmark"]) == (tid, b)
                }
                first, second = sorted(set(column.values()), reverse=True)[:2]
                want = {
                    m: T.BOLD if v == first else T.UNDERLINE if v == second else "" for m, v in column.items()
                }
                assert {r.method: getattr(r.cells[b], f"{key}_mark") for r in t.rows} == want, (tid, b, key)
    # the paper's typo (Last 0.5261 > Best 0.4938) ranked as printed and noted; a tie for second (T8)
    md = T.to_markdown(paper_tables["T3"])
    assert "| RPG-URKL | 0.4542 / 0.5260 | **0.5261** / 0.4938 | 0.9406 / **0.9539** |" in md
    assert "RPG-URKL, AIME25: Last > Best as printed in the paper (kept)." in md
    tex = T.to_latex(paper_tables["T8"])
    assert r"RPG-REINFORCE-FKL & \textbf{0.8727} / 0.8727 & \underline{0.1208} / \textbf{0.1667}" in tex
    assert "| RPG-REINFORCE-FKL | **0.8727** / 0.8727 | <u>0.1208</u> / **0.1667** |" in T.to_markdown(
        paper_tables["T8"]
    )


def test_committed_results_are_up_to_date(tmp_path: Path) -> None:
    """results/paper/ is exactly what scripts/make_results.sh regenerates."""
    out = tmp_path / "paper"
    assert T.main(["--paper", str(PAPER_CSV), "--out", str(out), "--formats", "md,tex,csv"]) == 0
    committed = ROOT / "results" / "paper"
    for f in sorted(p for p in out.iterdir() if p.name != ".lock"):  # the lock is not committed (.gitignore)
        assert (committed / f.name).is_file(), f"results/paper/{f.name} missing: run scripts/make_results.sh"
        assert (committed / f.name).read_text() == f.read_text(), f"results/paper/{f.name} is stale"


# --------------------------------------------------------------------------- user runs


def _last_best(tmp_path: Path) -> Path:
    return _write_csv(
        tmp_path / "last_best.csv",
        LAST_BEST_HEADER,
        [
            ["my-rpg", "aime24", "math_verify", 0.4, 200, 0.35, 0.45, 0.41, 150, 0.36, 0.46],
            ["my-rpg", "aime25", "math_verify", 0.2, 200, 0.15, 0.25, 0.3, 100, 0.25, 0.35],
            ["my-grpo", "aime24", "math_verify", 0.1, 200, "", "", 0.12, 50, "", ""],
        ],
    )


def test_user_run_beside_paper_rows_with_ci(tmp_path: Path, paper_tables: dict[str, T.BuiltTable]) -> None:
    lb = _last_best(tmp_path)
    (t6,) = T.build_tables(
        T.load_layout(), ["T6"], PAPER_CSV, [lb], labels={"my-rpg": "RPG-UFKL (ours)"}, grader="math_verify"
    )
    assert [r.label for r in t6.rows][-2:] == ["RPG-UFKL (ours)", "my-grpo"]
    assert [r.source for r in t6.rows] == ["paper"] * 6 + ["run"] * 2
    # the paper's rows keep the marks the paper printed, whatever runs stand beside them
    marks = [[(c.last_mark, c.best_mark) for c in r.cells.values()] for r in t6.rows[:6]]
    assert marks == [[(c.last_mark, c.best_mark) for c in r.cells.values()] for r in paper_tables["T6"].rows]
    md = T.to_markdown(t6)
    # the runs are ranked among themselves: 0.4000 > 0.1000 (my-grpo has no interval: no tie within noise)
    assert "| RPG-UFKL (ours) | **0.4000** [0.350, 0.450] / **0.4100** [0.360, 0.460] | " in md
    assert "| **0.2000** [0.150, 0.250] / **0.3000** [0.250, 0.350] |" in md  # the only run on AIME25
    # a run without an interval prints none; a benchmark it lacks prints a dash
    assert "| my-grpo | <u>0.1000</u> / <u>0.1200</u> | – |" in md
    assert "95% interval" in md and "the paper's rows among themselves" in md
    tex = T.to_latex(t6)
    assert r"\midrule" + "\nRPG-UFKL (ours) & \\textbf{0.4000}{\\scriptsize\\,[0.350, 0.450]}" in tex
    mine = T.to_frame(t6).set_index(["run", "benchmark"]).loc["my-rpg"]
    assert (mine.loc["aime24", "last_ci_low"], mine.loc["aime25", "best_step"]) == (0.35, 100)
    # --no-ci hides the intervals, not the rule: the same marks; --rank paper: runs are never marked
    (t6,) = T.build_tables(T.load_layout(), ["T6"], PAPER_CSV, [lb], grader="math_verify", show_ci=False)
    assert "| my-rpg | **0.4000** / **0.4100** |" in T.to_markdown(t6)
    (t6,) = T.build_tables(T.load_layout(), ["T6"], PAPER_CSV, [lb], rank="paper")
    assert "| my-rpg | 0.4000 [0.350, 0.450] / 0.4100 [0.360, 0.460] |" in T.to_markdown(t6)
    assert _marked(t6, "aime24", "last", T.BOLD) == ["RPG-UFKL"]


# --------------------------------------------------------------------------- ties within noise


def _noise_layout(tmp_path: Path) -> T.Layout:
    path = tmp_path / "layout.yaml"
    path.write_text("tables:\n  t:\n    title: Runs\n    paper_table: null\n    benchmarks: [addition]\n")
    return T.load_layout(path)


def _column(t: T.BuiltTable, key: str) -> dict[str, str]:
    return {r.run: getattr(r.cells["addition"], f"{key}_mark") for r in t.rows}


def test_ranked_on_the_value_as_displayed(tmp_path: Path) -> None:
    """Bold: the highest, underline: the second highest distinct value, ties sharing the mark; 0.30004
    and 0.3 tie at four decimals (runs without intervals: no tie within noise)."""
    rows = [[run, "addition", "math_verify", last, 5, "", "", best, 5, "", ""]
            for run, last, best in (("a", 0.30004, 0.1), ("b", 0.3, 0.3), ("c", 0.2, 0.2), ("d", 0.1, 0.3))]  # fmt: skip
    (t,) = T.build_tables(
        _noise_layout(tmp_path), None, None, [_write_csv(tmp_path / "lb.csv", LAST_BEST_HEADER, rows)]
    )
    assert _column(t, "last") == {"a": T.BOLD, "b": T.BOLD, "c": T.UNDERLINE, "d": ""}
    assert _column(t, "best") == {"a": "", "b": T.BOLD, "c": T.UNDERLINE, "d": T.BOLD}


def test_runs_whose_intervals_overlap_share_the_mark(tmp_path: Path) -> None:
    """Intervals only (last_best.csv): a run shares the mark of the column's highest (second highest)
    run when their 95% intervals overlap."""
    rows = [["a", "addition", "math_verify", 0.50, 5, 0.40, 0.60, 0.50, 5, 0.45, 0.55],
            ["b", "addition", "math_verify", 0.45, 5, 0.35, 0.55, 0.30, 5, 0.25, 0.35],
            ["c", "addition", "math_verify", 0.20, 5, 0.15, 0.25, 0.28, 5, 0.26, 0.30]]  # fmt: skip
    lb = _write_csv(tmp_path / "last_best.csv", LAST_BEST_HEADER, rows)
    (t,) = T.build_tables(_noise_layout(tmp_path), None, None, [lb])
    # Last: a [0.40, 0.60] and b [0.35, 0.55] overlap (0.40 <= 0.55): both bold; c [0.15, 0.25] lies below
    # b's 0.35: the second highest alone, underlined
    assert _column(t, "last") == {"a": T.BOLD, "b": T.BOLD, "c": T.UNDERLINE}
    # Best: a [0.45, 0.55] above b's 0.35: a alone bold; b [0.25, 0.35] and c [0.26, 0.30] overlap: both underlined
    assert _column(t, "best") == {"a": T.BOLD, "b": T.UNDERLINE, "c": T.UNDERLINE}
    assert "tied within noise: their 95% intervals overlap (conservative" in T.to_markdown(t)


def test_runs_tied_within_noise_by_their_paired_difference_share_the_mark(tmp_path: Path) -> None:
    """With the runs' samples, a run shares the mark when the exact sign-flip test of its paired
    difference to the column's highest run does not reject at 5%; the p-values here are enumerated
    from the samples in the test."""
    from rpg_eval.cli import main as cli_main

    # 12 problems x 4 samples; step 5 is Last. grpo: problem i right (i % 4) times of 4
    grpo = {(s, f"p{i:02d}"): [1] * (i % 4) + [0] * (4 - i % 4) for s in (0, 5) for i in range(12)}
    # "near": one sample more on p00 and p01, one fewer on p02: a difference of +1/48, within noise
    near = {k: ([1] + v[:-1]) if k[0] == 5 and k[1] in ("p00", "p01") else v for k, v in grpo.items()}
    near[(5, "p02")] = [1, 0, 0, 0]
    # "far": one sample more on every problem; "low": never right
    far = {k: ([1] + v[:-1]) if k[0] == 5 else v for k, v in grpo.items()}
    low = {k: [0] * 4 for k in grpo}
    runs = {"near": near, "grpo": grpo, "far": far, "low": low}
    dirs = {name: write_run(tmp_path / name, name, right) for name, right in runs.items()}

    def paired_p(a: dict, b: dict) -> float:  # every sign pattern of the per-problem differences at Last
        return enumerated_p([sum(a[(5, f"p{i:02d}")]) - sum(b[(5, f"p{i:02d}")]) for i in range(12)])

    assert sum(map(sum, near.values())) > sum(map(sum, grpo.values())) and paired_p(near, grpo) == 1.0
    assert paired_p(far, grpo) == 2 / 2**12  # every problem one sample better: never within noise

    def table(names: list[str]) -> T.BuiltTable:
        out = tmp_path / ("sum_" + "_".join(names))
        assert (
            cli_main(["summarize", *[str(dirs[n]) for n in names], "--out", str(out), "--iters", "200"]) == 0
        )
        (t,) = T.build_tables(_noise_layout(tmp_path), None, None, [out / "last_best.csv"], grader="math_verify",
                              sample_paths=[dirs[n] for n in names], stats=(500, 0))  # fmt: skip
        return t

    t = table(["near", "grpo", "low"])  # the top two tie within noise: both bold, "low" second
    assert _column(t, "last") == {"near": T.BOLD, "grpo": T.BOLD, "low": T.UNDERLINE}
    md = T.to_markdown(t)
    assert "sign-flip test of their paired difference on the same problems does not reject at 5%" in md
    assert "overlap" not in md
    t = table(["far", "grpo"])  # the top two differ: bold and underline
    assert _column(t, "last") == {"far": T.BOLD, "grpo": T.UNDERLINE}


def test_a_label_is_escaped_in_every_format(tmp_path: Path) -> None:
    from rpg_eval.report.tables.render import to_html

    (t,) = T.build_tables(
        _noise_layout(tmp_path), None, None, [_last_best(tmp_path)], labels={"my-rpg": "<i>a|b_$%</i>"}
    )
    assert "| <i>a\\|b_$%</i> |" in T.to_markdown(t) and "\n<i>a|b\\_\\$\\%</i> & " in T.to_latex(t)
    assert '<th scope="row">&lt;i&gt;a|b_$%&lt;/i&gt;</th>' in to_html(t)


def test_layout_yaml_places_and_labels_runs(tmp_path: Path) -> None:
    layout = tmp_path / "layout.yaml"
    layout.write_text("""benchmarks: {aime24: AIME24, aime25: AIME25}
tables:
  mine: {title: My 2K runs beside the paper, paper_table: T6, benchmarks: [aime24, aime25], rows: [{method: GRPO},
         {run: my-grpo, label: GRPO (ours)}, {method: RPG-UFKL, label: RPG-UFKL (paper)}, {run: my-rpg, label: RPG-UFKL (ours)}]}
""")
    (t,) = T.build_tables(T.load_layout(layout), None, PAPER_CSV, [_last_best(tmp_path)])
    assert [r.label for r in t.rows] == ["GRPO", "GRPO (ours)", "RPG-UFKL (paper)", "RPG-UFKL (ours)"]
    tex = T.to_latex(t)
    assert tex.count(r"\midrule") == 1 + 3  # header rule + each switch between paper and run rows
    # a table of runs only (no paper rows)
    layout.write_text("tables:\n  runs:\n    title: Ours\n    paper_table: null\n")
    (t,) = T.build_tables(T.load_layout(layout), None, PAPER_CSV / "unused", [_last_best(tmp_path)])
    assert [r.label for r in t.rows] == ["my-rpg", "my-grpo"]
    assert list(t.benchmark_labels.values()) == ["AIME24", "AIME25"]
    assert _marked(t, "aime24", "last", T.BOLD) == ["my-rpg"]


def test_summary_csv_reduced_to_last_and_best(tmp_path: Path) -> None:
    summary = tmp_path / "summary.csv"
    summary.write_text("run,checkpoint,step,benchmark,grader,mean,ci_low,ci_high\nr,global_step10,10,aime24,math_verify,"
                       "0.2,0.1,0.3\nr,s30,30,aime24,math_verify,0.25,0.2,0.3\nr,s20,20,aime24,math_verify,0.4,0.3,0.5\n")  # fmt: skip
    r = T.load_runs([summary]).iloc[0]
    assert (r["last"], r["last_step"], r["best"], r["best_step"]) == (0.25, 30, 0.4, 20)
    assert (r["best_ci_low"], r["best_ci_high"]) == (0.3, 0.5)


# --------------------------------------------------------------------------- errors and CLI


def test_bad_input_is_a_table_error_naming_the_file_column_or_run(tmp_path: Path) -> None:
    lb = _last_best(tmp_path)
    layout = tmp_path / "l.yaml"
    layout.write_text(
        "tables:\n  x:\n    paper_table: null\n    benchmarks: [aime24]\n    rows:\n      - {run: nope}\n"
    )
    runs_only = tmp_path / "o.yaml"
    runs_only.write_text("tables:\n  t:\n    paper_table: null\n    benchmarks: [aime24]\n")
    methods = tmp_path / "m.yaml"
    methods.write_text("tables:\n  T3:\n    rows:\n      - {method: PPO}\n")
    two = _write_csv(tmp_path / "two.csv", LAST_BEST_HEADER,
                     [["r", "aime24", "math_verify", 0.4, 200, "", "", 0.41, 150, "", ""],
                      ["r", "aime24", "paper", 0.3, 200, "", "", 0.31, 150, "", ""]])  # fmt: skip
    no_best = _write_csv(tmp_path / "lb.csv", ["run", "benchmark", "last"], [["r", "aime24", 0.1]])
    text = _write_csv(tmp_path / "lb2.csv", ["run", "benchmark", "last", "best"], [["r", "aime24", "x", 0.1]])
    paper = _write_csv(
        tmp_path / "paper.csv", ["table", "method", "benchmark", "last"], [["T3", "GRPO", "AIME24", 1]]
    )
    cases = {
        r"lb\.csv: missing column\(s\) best": lambda: T.load_runs([no_best]),
        r"lb2\.csv: column 'last' row 2 .*'x' is not a number": lambda: T.load_runs([text]),
        r"paper\.csv: missing column\(s\) model, context, best": lambda: T.load_paper(paper),
        r"names run 'nope', not found in .*last_best\.csv \(runs: my-rpg, my-grpo\)": lambda: T.build_tables(
            T.load_layout(layout), None, None, [lb]
        ),
        r"unknown table\(s\) T9; known: T3, T5, T6, T8": lambda: T.build_tables(
            T.load_layout(), ["T9"], PAPER_CSV
        ),
        r"names method 'PPO'": lambda: T.build_tables(T.load_layout(methods), None, PAPER_CSV),
        r"run 'r' has several graders \(math_verify, paper\)": lambda: T.build_tables(
            T.load_layout(), ["T6"], PAPER_CSV, [two]
        ),
        r"appears more than once": lambda: T.load_runs([two, two]),
        "has no maj@k": lambda: T.build_tables(T.load_layout(runs_only), None, None, [lb], metric="maj"),
    }
    # `mean=inf` in a summary.csv was accepted and marked Best (bold): a value that is not finite is refused
    for i, value in enumerate(["inf", "1e400", "nan"]):
        (tmp_path / f"nf{i}.csv").write_text(f"run,benchmark,last,best\nr,aime24,0.4,{value}\n")
        said = "not a number" if value == "nan" else "not a finite number"
        cases[rf"nf{i}\.csv: column 'best' row 2 .*{said}"] = lambda i=i: T.load_runs(
            [tmp_path / f"nf{i}.csv"]
        )
    summary = tmp_path / "summary.csv"
    summary.write_text(
        "run,checkpoint,step,benchmark,grader,mean\nr,a,10,aime24,g,0.2\nr,b,20,aime24,g,-inf\n"
    )
    cases[r"summary\.csv: column 'mean' row 3 .*not a finite number"] = lambda: T.load_runs([summary])
    for said, call in cases.items():
        with pytest.raises(T.TableError, match=said):
            call()
    (t,) = T.build_tables(T.load_layout(), ["T6"], PAPER_CSV, [two], grader="paper")
    assert t.rows[-1].cells["aime24"].last == 0.3


def test_cli_main_writes_all_formats(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lb = _last_best(tmp_path)
    out = tmp_path / "out"
    rc = T.main(["--paper", str(PAPER_CSV), "--table", "T6", "--runs", str(lb), "--label", "my-rpg=Ours",
                 "--formats", "md,tex,csv", "--out", str(out)])  # fmt: skip
    assert rc == 0
    assert sorted(p.name for p in out.iterdir()) == [".lock", ".rpg-owner", "T6.csv", "T6.md", "T6.tex"]
    assert "| Ours |" in (out / "T6.md").read_text()
    refuses(
        capsys, ["--paper", str(PAPER_CSV), "--table", "T9"], "unknown table(s) T9", tmp_path, main=T.main
    )
    said = "missing.csv: the paper's numbers are not there"
    refuses(
        capsys, ["--paper", str(tmp_path / "missing.csv"), "--out", str(out)], said, tmp_path, main=T.main
    )


def test_runs_by_maj_at_k(tmp_path: Path) -> None:
    """`--metric maj` shows Last / Best of maj@k (Best chosen by maj@k), from the columns rpg-eval
    summarize writes (a file without them: test_bad_input_is_a_table_error_naming_the_file_column_or_run)."""
    head = LAST_BEST_HEADER + ["last_maj", "last_maj_ci_low", "last_maj_ci_high", "best_maj", "best_maj_step",
                               "best_maj_ci_low", "best_maj_ci_high"]  # fmt: skip
    lb = _write_csv(tmp_path / "last_best.csv", head,
                    [["my-rpg", "aime24", "math_verify", 0.4, 200, 0.35, 0.45, 0.41, 150, 0.36, 0.46,
                      0.5, 0.4, 0.6, 0.7, 100, 0.6, 0.8]])  # fmt: skip
    layout = tmp_path / "layout.yaml"
    layout.write_text("tables:\n  t:\n    title: Ours\n    paper_table: null\n    benchmarks: [aime24]\n")
    (t,) = T.build_tables(T.load_layout(layout), None, None, [lb], metric="maj")
    cell = t.rows[0].cells["aime24"]
    assert (cell.last, cell.best, cell.best_step, cell.best_ci) == (0.5, 0.7, 100, (0.6, 0.8))
    md = T.to_markdown(t)
    assert "| my-rpg | **0.5000** [0.400, 0.600] / **0.7000** [0.600, 0.800] |" in md and "maj@k" in md
