"""Benchmark loaders: AIME24, AIME25, AMC23 from a hub dataset id or a local file.

Accepted sources (``load_benchmark(source, benchmark)``):

* a local ``.jsonl`` with fields ``id``, ``problem``, ``answer`` (``question``/``Problem``,
  ``Answer``/``ground_truth`` and ``ID``/``idx`` are accepted too);
* a local ``.parquet``, either flat (same fields) or the RPG paper's verl schema
  (``prompt`` chat list, ``reward_model.ground_truth``, ``extra_info.index`` /
  ``raw_problem``), where every problem is repeated 32 times: collapsed to one problem
  with ``repeats = 32`` after checking the copies agree;
* a directory: the benchmark's file is looked up by name (``aime24.jsonl``,
  ``aime-2024.parquet``, ...);
* anything else is a Hugging Face dataset id (``HUB_DEFAULTS`` holds the defaults).

Validation: required fields, answer types (str or integral number), duplicate ids, and
text damaged by bad escapes (``\\frac`` read as form feed + "rac", ``\\triangle`` as tab +
"riangle").  A control character followed by the rest of a known LaTeX command is
repaired; one that cannot be explained is rejected with ``file:line``.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rpg_openrlhf.common.cliutil import load_json
from rpg_openrlhf.common.inputs import InputFileError, check_input, open_input

BENCHMARKS = ("aime24", "aime25", "amc23")

# Hub defaults (dataset id, split).  Used only when no local data is given.
HUB_DEFAULTS: dict[str, tuple[str, str]] = {
    "aime24": ("Maxwell-Jia/AIME_2024", "train"),
    "aime25": ("math-ai/aime25", "test"),
    "amc23": ("math-ai/amc23", "test"),
}
# File names searched in a data directory (ours first, then the paper's verl files).
FILE_NAMES: dict[str, tuple[str, ...]] = {
    "aime24": ("aime24.jsonl", "aime24.parquet", "aime-2024.parquet", "aime_2024.jsonl"),
    "aime25": ("aime25.jsonl", "aime25.parquet", "aime-2025.parquet", "aime_2025.jsonl"),
    "amc23": ("amc23.jsonl", "amc23.parquet", "amc-23.parquet", "amc_23.jsonl"),
}
ID_KEYS = ("id", "ID", "idx", "problem_id", "unique_id")
PROBLEM_KEYS = ("problem", "Problem", "question", "Question")
ANSWER_KEYS = ("answer", "Answer", "ground_truth", "final_answer")


class DataError(ValueError):
    """Bad benchmark data; the message names the file and line (or row)."""


@dataclass(frozen=True)
class Problem:
    """One benchmark problem.  ``repeats``: copies in the source (32 in the paper's files);
    ``prompt``: the source's own rendered prompt, if it carries one; ``where``: file:line."""

    id: str
    problem: str
    answer: str
    benchmark: str
    where: str
    repeats: int = 1
    prompt: str | None = None


# --------------------------------------------------------------------------- escapes

# Control character produced by a JSON/Python escape -> the letter that was eaten, and the
# LaTeX commands (without backslash and that letter, space-separated) that can follow it.
_ESCAPES: dict[str, tuple[str, str]] = {
    "\x0c": ("f", "rac orall lat box rak"),
    "\t": ("t", "riangle imes heta an ext extbf extit frac ilde op au herefore o"),
    "\x08": ("b", "inom eta ar f oxed mod egin ig igl igr ot ullet ackslash"),
    "\x07": ("a", "lpha ngle pprox st rrow"),
    "\x0b": ("v", "ec arphi ee dots arepsilon ert"),
    "\r": ("r", "ight ho angle m ightarrow Rightarrow floor ceil"),
}
_CTRL_RE = re.compile("([\x07\x08\x0b\x0c\t\r])([A-Za-z]*)")
# Control characters no eaten escape explains (NUL, ESC, DEL, ...): never text of a problem or answer.
_OTHER_CTRL_RE = re.compile("[\x00-\x06\x0e-\x1f\x7f]")
_LONE_SURROGATE_RE = re.compile("[\ud800-\udfff]")  # from a JSON escape ("\\ud800"); no text holds one


def repair_escapes(text: str, where: str) -> str:
    """Undo escapes that ate a LaTeX backslash; raise DataError where it is not certain.

    A tab or carriage return that is not followed by a letter is ordinary whitespace and
    is kept (``\\r\\n`` line ends too); a newline can never be told apart and is kept. Any other
    control character (NUL, ESC, DEL) is an error.
    """
    bad = _LONE_SURROGATE_RE.search(text)
    if bad:
        raise DataError(
            f"{where}: lone surrogate {bad.group()!r} at offset {bad.start()} in {text[:60]!r}: not text"
        )
    bad = _OTHER_CTRL_RE.search(text)
    if bad:
        raise DataError(
            f"{where}: control character {bad.group()!r} at offset {bad.start()} in {text[:60]!r}: not text"
        )

    def repair(m: re.Match) -> str:
        c, word = m[1], m[2]
        letter, rests = _ESCAPES[c]
        if word in rests.split():  # commands end at the first non-letter: exact match only
            return "\\" + letter + word
        if not word and c in "\t\r":
            return c
        if not word:
            raise DataError(
                f"{where}: control character {c!r} at offset {m.start()} (bad escape?) in {text[:60]!r}"
            )
        raise DataError(
            f"{where}: control character {c!r} before {word!r} at offset {m.start()}: looks like a broken "
            f"escape (\\{letter}{word}?) that cannot be repaired with certainty"
        )

    return _CTRL_RE.sub(repair, text)


# --------------------------------------------------------------------------- records -> problems


def _pick(row: dict, keys: tuple[str, ...]) -> Any:
    for k in keys:
        if k in row and row[k] is not None:
            return row[k]
    return None


def _answer_str(value: Any, where: str) -> str:
    """Answers are strings or integral numbers (json ints, or floats like 204.0 from pandas)."""
    if isinstance(value, bool) or value is None:
        raise DataError(f"{where}: answer must be a string or an integer, got {value!r}")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if value.is_integer():
            return str(int(value))
        raise DataError(f"{where}: answer {value!r} is a non-integral float (store exact answers as strings)")
    if not isinstance(value, str):
        raise DataError(f"{where}: answer must be a string or an integer, got {type(value).__name__}")
    value = repair_escapes(value, where).strip()  # repair first: strip() would eat a form feed
    if not value:
        raise DataError(f"{where}: empty answer")
    check_gold(value, where)
    return value


def check_gold(answer: str, where: str) -> None:
    """DataError naming ``where`` when ``answer`` cannot be graded against (graders.gold_damage)."""
    from .graders import gold_damage

    damage = gold_damage(answer)
    if damage:
        raise DataError(f"{where}: {damage}")


def _is_verl(row: dict) -> bool:
    return "reward_model" in row and "prompt" in row


def _verl_problem(row: dict, where: str) -> tuple[str, str, str, str | None]:
    """(id, problem, answer, prompt) of one verl-schema row."""
    rm = row.get("reward_model")
    if not isinstance(rm, dict) or "ground_truth" not in rm:
        raise DataError(f"{where}: verl row without reward_model.ground_truth")
    extra = row.get("extra_info") if isinstance(row.get("extra_info"), dict) else {}
    prompt = row.get("prompt")
    prompt_text = None
    if prompt is not None and len(prompt) > 0:
        first = prompt[-1] if not isinstance(prompt, str) else {"content": prompt}
        prompt_text = first.get("content") if isinstance(first, dict) else None
    problem = extra.get("raw_problem") or extra.get("problem") or prompt_text
    if not isinstance(problem, str) or not problem.strip():
        raise DataError(f"{where}: verl row without extra_info.raw_problem or prompt content")
    pid = extra.get("index")
    pid = str(pid) if pid is not None else None
    return pid, problem, _answer_str(rm["ground_truth"], where), prompt_text


def problems_from_rows(rows: list[tuple[str, dict]], benchmark: str, source: str) -> list[Problem]:
    """Validate rows ((where, row) pairs) and collapse repeated problems (paper format).

    Flat rows: duplicate ids are an error.  verl rows: rows with the same problem text are
    copies of one problem (all copies must agree on answer and prompt).
    """
    if not rows:
        raise DataError(f"{source}: no rows")
    if _is_verl(rows[0][1]):
        return _verl_problems(rows, benchmark, source)
    return _flat_problems(rows, benchmark)


def _flat_problems(rows: list[tuple[str, dict]], benchmark: str) -> list[Problem]:
    """Problems of flat rows (id, problem, answer); a repeated id is an error naming both rows."""
    problems: list[Problem] = []
    seen: dict[str, str] = {}
    texts: dict[str, tuple[str, str]] = {}  # problem text -> (answer, where first seen)
    for n, (where, row) in enumerate(rows):
        if not isinstance(row, dict):
            raise DataError(f"{where}: expected an object, got {type(row).__name__}")
        problem = _pick(row, PROBLEM_KEYS)
        if not isinstance(problem, str) or not problem.strip():
            raise DataError(f"{where}: missing or empty field 'problem' (one of {PROBLEM_KEYS})")
        answer = _pick(row, ANSWER_KEYS)
        if answer is None:
            raise DataError(f"{where}: missing field 'answer' (one of {ANSWER_KEYS})")
        pid = _pick(row, ID_KEYS)
        pid = str(pid) if pid is not None else str(n)
        if pid in seen:
            raise DataError(f"{where}: duplicate id {pid!r} (first at {seen[pid]})")
        seen[pid] = where
        answer_text = _answer_str(answer, where)  # repaired there
        text = repair_escapes(problem, where)
        first = texts.setdefault(text, (answer_text, where))
        if first[0] != answer_text:
            raise DataError(
                f"{where}: the problem of {first[1]} with another answer ({answer_text[:60]!r} here, "
                f"{first[0][:60]!r} there): which one is right? fix or remove one of the two"
            )
        problems.append(Problem(pid, text, answer_text, benchmark, where))
    return problems


def _verl_problems(rows: list[tuple[str, dict]], benchmark: str, source: str) -> list[Problem]:
    """Problems of the paper's verl rows: copies of one problem text collapsed into one."""
    groups: dict[str, list] = {}
    for where, row in rows:
        if not _is_verl(row):
            raise DataError(f"{where}: mixed verl and flat rows")
        pid, problem, answer, prompt = _verl_problem(row, where)
        g = groups.setdefault(problem, [where, pid, answer, prompt, 0])
        if (g[2], g[3]) != (answer, prompt):
            raise DataError(f"{where}: copy of the problem at {g[0]} disagrees on answer or prompt")
        if g[1] != pid:
            g[1] = None  # extra_info.index numbers the copies in some files: not a problem id
        g[4] += 1
    counts = {g[4] for g in groups.values()}
    if len(counts) != 1:
        raise DataError(f"{source}: problems are repeated unequally ({sorted(counts)} copies)")
    indexed = [g[1] for g in groups.values()]
    use_index = None not in indexed and len(set(indexed)) == len(indexed)
    problems = []
    for key, (where, pid, answer, prompt, count) in groups.items():
        # Without a per-problem index, a hash of the text is an id that survives reshuffling.
        pid = pid if use_index else "h" + hashlib.sha1(key.encode()).hexdigest()[:10]
        text = repair_escapes(key, where)  # the answer is repaired already (_answer_str)
        prompt = repair_escapes(prompt, where) if prompt else None
        problems.append(Problem(pid, text, answer, benchmark, where, repeats=count, prompt=prompt))
    # The paper's files are shuffled; order problems by index (else by text) for stable slices.
    if use_index and all(p.id.isdigit() for p in problems):
        problems.sort(key=lambda p: int(p.id))
    else:
        problems.sort(key=lambda p: p.problem)
    return problems


def _read_jsonl(path: Path) -> list[tuple[str, dict]]:
    rows = []
    # Binary, decoded line by line: a bad byte then names the file and line (text mode would raise
    # a bare UnicodeDecodeError from inside the iterator).
    with open_input(path) as f:  # a link to /dev/zero or a FIFO is refused, not read forever
        for lineno, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise DataError(f"{path}:{lineno}: not valid UTF-8") from None
            if not line.strip():
                continue
            rows.append((f"{path}:{lineno}", load_json(line, f"{path}:{lineno}", DataError)))
    return rows


def _read_parquet(path: Path) -> list[tuple[str, dict]]:
    import pandas as pd

    df = pd.read_parquet(path)
    rows = df.to_dict(orient="records")
    # parquet has no lines: "row N" (0-based, as pandas shows it) names the place.
    return [(f"{path}:row {i}", _plain(r)) for i, r in enumerate(rows)]


def _plain(obj: Any) -> Any:
    """numpy arrays/scalars from pandas -> lists/python scalars."""
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if hasattr(obj, "tolist") and not isinstance(obj, str):
        return _plain(obj.tolist())
    if isinstance(obj, list | tuple):
        return [_plain(v) for v in obj]
    return obj


def find_local_file(benchmark: str, data_dir: str | Path) -> Path:
    """The benchmark's file inside ``data_dir`` (see FILE_NAMES)."""
    d = Path(data_dir)
    for name in FILE_NAMES.get(benchmark, (f"{benchmark}.jsonl", f"{benchmark}.parquet")):
        try:  # a device, FIFO or directory under the benchmark's name: say what it is, not "no file"
            check_input(d / name)
        except InputFileError as e:
            raise DataError(str(e)) from None
        if (d / name).is_file():
            return d / name
    raise DataError(
        f"{d}: no file for benchmark {benchmark!r} (looked for {', '.join(FILE_NAMES.get(benchmark, ()))})"
    )


def load_benchmark(source: str | Path | None, benchmark: str, split: str | None = None) -> list[Problem]:
    """Problems of ``benchmark`` from a local file/dir or a hub id (None -> HUB_DEFAULTS)."""
    if source is None:
        if benchmark not in HUB_DEFAULTS:
            raise DataError(f"no default source for benchmark {benchmark!r}")
        source, default_split = HUB_DEFAULTS[benchmark]
        split = split or default_split
    p = Path(source)
    if p.is_dir():
        p = find_local_file(benchmark, p)
    try:
        check_input(p)  # a FIFO or a device: say what it is ("no such file" below would be wrong)
    except InputFileError as e:
        raise DataError(str(e)) from None
    if p.is_file():
        if p.suffix in (".jsonl", ".json"):
            rows = _read_jsonl(p)
        elif p.suffix == ".parquet":
            rows = _read_parquet(p)
        else:
            raise DataError(f"{p}: unsupported file type (use .jsonl or .parquet)")
        return problems_from_rows(rows, benchmark, str(p))
    if _looks_local(str(source)):
        raise DataError(f"{source}: no such file or directory")
    return _load_hub(str(source), benchmark, split or "test")


def _looks_local(source: str) -> bool:
    """A source that names a local path, not a hub dataset id ("owner/name"): it starts like a
    path, ends in a data file suffix, or has no "/" or more than one (a hub id has exactly one)."""
    return (
        source.startswith((".", "/", "~"))
        or source.endswith((".jsonl", ".json", ".parquet", ".csv"))
        or source.count("/") != 1
    )


def _load_hub(dataset_id: str, benchmark: str, split: str) -> list[Problem]:
    """Hub dataset -> problems (same validation; 'where' is id[split] row N)."""
    import datasets

    ds = datasets.load_dataset(dataset_id, split=split)
    rows = [(f"{dataset_id}[{split}]:row {i}", _plain(dict(r))) for i, r in enumerate(ds)]
    return problems_from_rows(rows, benchmark, f"{dataset_id}[{split}]")


def select(problems: list[Problem], limit: int | None = None, ids: list[str] | None = None) -> list[Problem]:
    """The first ``limit`` problems, then only ``ids`` (keeps the source order)."""
    out = problems[:limit] if limit else list(problems)
    if ids is not None:
        wanted = set(ids)
        out = [p for p in out if p.id in wanted]
    return out
