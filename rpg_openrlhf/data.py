"""``rpg-prepare-data``: DAPO-Math-17k -> OpenRLHF's prompt jsonl with the paper's prompt.

Input: a hub dataset id or a local ``.parquet`` / ``.jsonl`` / ``.json`` file, in verl's schema
(``prompt`` chat list, ``reward_model.ground_truth``) or flat (``problem``/``question``,
``answer``/``ground_truth``). DAPO templates are unwrapped and duplicates dropped (the hub copy
repeats every problem ~100x). Output, one object a line: ``{"prompt", "label", "problem", "index"}``
(train with ``--data.input_key prompt --data.label_key label --data.apply_chat_template``); it is a
valid input too. ``--english-only`` drops CJK text, printing every drop's reason: the paper kept
13.9k English problems without saying how. A malformed row is one error naming ``file:line`` (or
``file:row i``) and the field, exit 2, nothing written.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from rpg_openrlhf.common.atomic import atomic_write, check_output_path
from rpg_openrlhf.common.inputs import check_input, open_input

#: The DAPO prompt used by the paper for training and evaluation.
PROMPT_PREFIX = (
    "Solve the following math problem step by step. The last line of your response should be of the "
    "form Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
)
PROMPT_SUFFIX = '\n\nRemember to put your answer on its own line after "Answer:".'
DEFAULT_INPUT = "BytedTsinghua-SIA/DAPO-Math-17k"

_CJK_LETTERS = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]")
_CJK_PUNCT = re.compile(r"[\u3000-\u303f\uff00-\uffef]")


def make_prompt(problem: str) -> str:
    """The paper's (DAPO's) prompt around a raw problem."""
    return f"{PROMPT_PREFIX}{problem}{PROMPT_SUFFIX}"


def unwrap_problem(text: str) -> str:
    """The raw problem of a prompt that may already carry the DAPO template."""
    text = text.strip()
    if text.startswith(PROMPT_PREFIX.strip()):
        text = text[len(PROMPT_PREFIX.strip()) :]
    if text.endswith(PROMPT_SUFFIX.strip()):
        text = text[: -len(PROMPT_SUFFIX.strip())]
    return text.strip()


def non_english_reason(problem: str) -> str | None:
    """Why ``problem`` is not English (None if it is)."""
    if _CJK_LETTERS.search(problem):
        return "CJK letters (ideographs, kana or hangul)"
    if _CJK_PUNCT.search(problem):
        return "CJK / full-width punctuation"
    return None


# ----------------------------------------------------------------------------- reading
def _answer_str(answer: Any, where: str) -> str:
    """Answers are strings or integral numbers; anything else would become a wrong label."""
    if hasattr(answer, "item") and getattr(answer, "shape", None) == () and not isinstance(answer, str):
        answer = answer.item()  # numpy scalars from parquet; arrays (shape != ()) are rejected below
    # bool before int: True is an int, but str(True) == "True" is never a math answer.
    if isinstance(answer, bool) or not isinstance(answer, (str, int, float)):
        raise ValueError(f"{where}: answer must be a string or an integer, got {type(answer).__name__}")
    if isinstance(answer, float):
        if not answer.is_integer():
            raise ValueError(
                f"{where}: answer {answer!r} is a non-integral float (store exact answers as strings)"
            )
        answer = int(answer)  # 204.0 from a pandas column is the label "204"
    return str(answer).strip()


BAD_ESCAPES = ("error", "keep", "drop")
BAD_ESCAPE_DROP = "control character that is not a known broken LaTeX escape"
#: --conflicting-answers: copies of one problem with other answers refused (default), the first
#: copy's answer kept (what this tool did silently before; the paper's data has 12 such problems),
#: or every copy dropped.
CONFLICTS = ("error", "first", "drop")
CONFLICT_DROP = "problem whose copies disagree on the answer (every copy)"


class BadEscapeError(ValueError):
    """A problem holds a control character that cannot be repaired with certainty."""


def _problem_and_answer(row: Any, where: str, bad_escapes: str = "error") -> tuple[str, str]:
    """(raw problem, label) of one input row; ``where`` (``file:line`` / ``file:row i``) names it.

    ``bad_escapes``: what to do with a control character that ``rpg_eval.data.repair_escapes``
    cannot explain: ``error`` (raise :class:`BadEscapeError`), ``keep`` (the text as it is) or
    ``drop`` (raise too; :func:`prepare` catches it and counts the drop).
    """
    from rpg_eval.data import DataError, check_gold, repair_escapes

    if not isinstance(row, dict):
        raise ValueError(
            f"{where}: expected a JSON object (a row with named fields), got {type(row).__name__}"
        )
    prompt = row.get("prompt")
    if prompt is not None and not isinstance(prompt, str):
        problem = _chat_problem(prompt, where)
    else:
        problem = prompt if prompt is not None else row.get("problem", row.get("question"))
    answer = None
    reward_model = row.get("reward_model")
    if isinstance(reward_model, dict):
        answer = reward_model.get("ground_truth")
    if answer is None:
        answer = next((row[k] for k in ANSWER_FIELDS if row.get(k) is not None), None)
    if problem is not None and not isinstance(problem, str):
        raise ValueError(f"{where}: the problem must be a string, got {type(problem).__name__}")
    if not isinstance(problem, str) or not problem.strip():
        raise ValueError(f"{where}: no problem text (expected 'prompt', 'problem' or 'question')")
    label = None if answer is None else _answer_str(answer, where)
    if not label:
        raise ValueError(f"{where}: no answer (expected 'reward_model.ground_truth' or 'answer')")
    check_gold(label, where)  # "\boxed{}", "$$": the paper grader would match an empty answer to it
    # "\\frac" written as "\frac" arrives as form feed + "rac": repaired where certain. The hub's
    # copy has 40 unexplained ones (PDF form feeds / tabs) the paper trained on: an explicit choice.
    try:
        problem = repair_escapes(problem, where)
    except DataError as e:
        if bad_escapes != "keep":
            raise BadEscapeError(f"{e} (--bad-escapes keep|drop to keep or drop such problems)") from e
    return unwrap_problem(problem), label


# Where a row's answer may be, after verl's reward_model.ground_truth ("label": this tool's output).
ANSWER_FIELDS = ("answer", "ground_truth", "label", "solution")


def _chat_problem(prompt: Any, where: str) -> str:
    """The first user message of a chat-list ``prompt`` (verl's schema)."""
    if hasattr(prompt, "tolist") and not isinstance(prompt, str):
        prompt = prompt.tolist()  # numpy arrays from parquet
    if not isinstance(prompt, list | tuple):
        raise ValueError(
            f"{where}: 'prompt' must be a string or a chat list of {{'role', 'content'}} messages, "
            f"got {type(prompt).__name__}"
        )
    if not prompt:
        raise ValueError(f"{where}: 'prompt' is an empty chat list")
    for i, m in enumerate(prompt):
        if not isinstance(m, dict) or not isinstance(m.get("content"), str):
            raise ValueError(
                f"{where}: 'prompt'[{i}] must be a {{'role', 'content'}} message with string content, "
                f"got {type(m).__name__ if not isinstance(m, dict) else m}"[:300]
            )
    user = [m for m in prompt if m.get("role", "user") == "user"] or list(prompt)
    return user[0]["content"]


def read_rows(source: str, split: str = "train") -> Iterator[tuple[str, Any]]:
    """``(where, row)`` of a local parquet/jsonl/json file or of a Hugging Face dataset id.

    ``where`` is ``source:LINE`` (jsonl, 1-based) or ``source:row I`` (parquet, json, hub;
    0-based), so every later error can name the row it is about.
    """
    if os.path.isdir(source):
        raise ValueError(f"{source}: is a directory; give a .parquet, .jsonl or .json file")
    if os.path.exists(source):
        check_input(source, "--input")  # a FIFO would hang the read, /dev/zero fill the memory
        ext = os.path.splitext(source)[1].lower()
        if ext == ".parquet":
            import pandas as pd

            for i, row in enumerate(pd.read_parquet(source).to_dict("records")):
                yield f"{source}:row {i}", row
            return
        if ext in (".jsonl", ".json"):
            yield from (_read_json(source) if ext == ".json" else _read_jsonl(source))
            return
        raise ValueError(
            f"{source}: unsupported file type {ext or '(none)'!r}; use .parquet, .jsonl or .json"
        )
    if source.startswith((".", "/", "~")) or source.endswith((".parquet", ".jsonl", ".json")):
        raise ValueError(f"{source}: no such file")
    try:
        import datasets

        ds = datasets.load_dataset(source, split=split)
    except Exception as e:  # offline, unknown id, ...
        raise ValueError(f"{source}: could not load the Hugging Face dataset (split {split!r}): {e}") from e
    for i, row in enumerate(ds):
        yield f"{source}:row {i}", row


def _read_json(source: str) -> Iterator[tuple[str, Any]]:
    """Rows of a .json file holding a list of objects; errors name the line (hostile input too:
    bytes that are not UTF-8, 100,000 nested arrays; integers past int()'s digit limit are kept
    as their digits)."""
    from rpg_openrlhf.common.cliutil import load_json

    with open_input(source, "--input") as f:
        data = load_json(f.read(), source, multiline=True)
    if not isinstance(data, list):
        raise ValueError(f"{source}: a .json input must hold a list of objects")
    for i, row in enumerate(data):
        yield f"{source}:row {i}", row


def _read_jsonl(source: str) -> Iterator[tuple[str, Any]]:
    """Rows of a .jsonl file, one per non-blank line; errors name the line."""
    from rpg_openrlhf.common.cliutil import load_json

    # Bytes, decoded line by line: a bad byte is then reported with its line.
    with open_input(source, "--input") as f:
        for n, raw_line in enumerate(f, 1):
            if raw_line.strip():
                yield f"{source}:{n}", load_json(raw_line, f"{source}:{n}")


def prepare(
    rows: Iterable[tuple[str, Any]],
    english_only: bool = False,
    max_samples: int | None = None,
    source: str = "input",
    bad_escapes: str = "error",
    conflicts: str = "error",
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Records for OpenRLHF and a report: counts of rows, duplicates and drops by reason.

    ``rows``: ``(where, row)`` pairs as :func:`read_rows` yields them; ``source`` names the input
    in the "no rows" error; ``bad_escapes``: see :func:`_problem_and_answer`; ``conflicts``: a copy
    with another answer than the first copy is an error naming both rows, keeps the first answer
    ("first") or drops every copy ("drop").
    """
    out: list[dict[str, Any]] = []
    seen: dict[str, tuple[str, str]] = {}  # problem -> (answer, where first seen)
    conflicted: set[str] = set()
    dropped: Counter[str] = Counter()
    n_rows = 0
    for i, (where, row) in enumerate(rows):
        n_rows += 1
        try:
            problem, answer = _problem_and_answer(row, where, bad_escapes)
        except BadEscapeError:
            if bad_escapes != "drop":
                raise
            dropped[BAD_ESCAPE_DROP] += 1
            continue
        if problem in seen:
            first, first_where = seen[problem]
            if first != answer and conflicts == "error":
                raise ValueError(
                    f"{where}: the problem of {first_where} with another answer ({answer[:60]!r} here, "
                    f"{first[:60]!r} there); fix the data, or --conflicting-answers drop to drop every copy"
                )
            if first != answer:
                conflicted.add(problem)
            dropped["duplicate problem"] += 1
            continue
        seen[problem] = (answer, where)
        if english_only:
            reason = non_english_reason(problem)
            if reason:
                dropped[reason] += 1
                continue
        out.append({"prompt": make_prompt(problem), "label": answer, "problem": problem, "index": i})
    if conflicted and conflicts == "drop":
        out = [r for r in out if r["problem"] not in conflicted]
        dropped[CONFLICT_DROP] = len(conflicted)
    if n_rows == 0:
        raise ValueError(f"{source}: no rows")
    if max_samples is not None:  # >= 1: the parser's
        out = out[:max_samples]
    report = {"rows": n_rows, "unique": len(seen), "kept": len(out), "dropped": dict(dropped),
              "conflicting": len(conflicted)}  # fmt: skip
    return out, report


def write_jsonl(records: Sequence[dict[str, Any]], path: str) -> None:
    """Write records atomically (a temp file next to ``path``, then a rename)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with atomic_write(path) as f:
        for rec in records:
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point: one line ``rpg-prepare-data: error: ...`` and exit 2 on any failure."""
    from rpg_openrlhf.common.cliutil import report_errors

    return report_errors("rpg-prepare-data", _main, argv)


def _main(argv: list[str]) -> int:
    from rpg_openrlhf.common.cliutil import OneLineParser, int_at_least

    parser = OneLineParser(prog="rpg-prepare-data", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--input",
        default=DEFAULT_INPUT,
        help=f"hub id or local .parquet/.jsonl/.json (default {DEFAULT_INPUT})",
    )
    parser.add_argument("--output", required=True, help="output jsonl for --data.prompt_dataset")
    parser.add_argument(
        "--debug", action="store_true", help="print the traceback of a failure (also RPG_DEBUG=1)"
    )
    parser.add_argument("--split", default="train", help="hub split (default train)")
    parser.add_argument(
        "--english-only", action="store_true", help="drop problems with CJK text (paper: 13.9k kept)"
    )
    parser.add_argument(
        "--max-samples", type=int_at_least(1), default=None, help="keep at most this many problems (>= 1)"
    )
    parser.add_argument(
        "--bad-escapes",
        choices=BAD_ESCAPES,
        default="error",
        help="a problem with a control character that is no known broken LaTeX escape: error (default), "
        "keep it as it is (the paper's data has 40), or drop it",
    )
    parser.add_argument(
        "--conflicting-answers",
        choices=CONFLICTS,
        default="error",
        help="copies of one problem with other answers: error naming both rows (default), keep the first "
        "copy's answer, or drop every copy (the paper's data has 12 such problems)",
    )
    a = parser.parse_args(argv)
    check_output_path(a.output, "--output", [a.input])  # not a link, folder, FIFO, or the input
    records, report = prepare(
        read_rows(a.input, a.split),
        a.english_only,
        a.max_samples,
        source=a.input,
        bad_escapes=a.bad_escapes,
        conflicts=a.conflicting_answers,
    )
    if not records:
        raise ValueError("no problems left after filtering")
    write_jsonl(records, a.output)
    print(
        f"rpg-prepare-data: {report['rows']} rows, {report['unique']} unique problems, kept {report['kept']}"
    )
    for reason, n in sorted(report["dropped"].items(), key=lambda kv: -kv[1]):
        print(f"  dropped {n}: {reason}")
    if report["conflicting"] and a.conflicting_answers == "first":
        print(f"  {report['conflicting']} problems' copies disagree on the answer: kept the first copy's")
    if a.english_only:
        print("  (the paper kept 13.9k English problems; its exact filter is not published)")
    print(f"  wrote {a.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
