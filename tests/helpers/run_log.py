"""What an E2E test shows when a run fails: the FIRST error of the run (the engine's, a worker's, the
driver's), with where it is in the log, then the log's last lines, never only its tail.

A run's log interleaves the driver with every Ray worker (lines prefixed ``(ActorName pid=N)``) and
vLLM's engine core (``(EngineCore pid=N)``). When one process fails, the others fail after it with
errors of their own (``EngineDeadError``, ``RayTaskError``, ``ActorDiedError``), which fill the tail;
the cause is the first error.
"""

from __future__ import annotations

import re

#: A line that starts an error (matched after the Ray prefix is removed).
ERROR_START = re.compile(
    r"Traceback \(most recent call last\)"
    r"|Fatal Python error|Segmentation fault|Segfault encountered|core dumped|terminate called|\bAborted\b"  # tvm_ffi's SIGSEGV handler (imported by vLLM) prints "Segfault encountered"
    r"|(?:^|\s|\[)(?:ERROR|CRITICAL)(?:\]|\s|:)"  # Python's logging (vLLM, Ray, DeepSpeed)
    r"|\[E\d{4} | E \d+ \d+\] "  # C++ logs: torch/c10 ([E1128 ...]), Ray ([... E pid tid])
    r"|exited unexpectedly|died unexpectedly|\bdied with\b|exit code -?\d+ \(|killed by signal"
    r"|\b[A-Z]\w*(?:Error|Exception): |rpg-train: error:"
)
#: Error-looking lines that are not errors of the run (found harmless; say why beside each).
NOT_ERRORS = (
    # from a path with a space: vLLM's LD_PRELOAD cannot name it; engines run without it
    "ld.so: object",
)
#: ``(ActorName pid=123) `` or ``(EngineCore pid=123) `` (Ray's and vLLM's line prefixes; Ray colours its
#: own with ANSI escapes, ``\x1b[36m(ActorName pid=123)\x1b[0m ``).
PREFIX = re.compile(r"(?:\x1b\[[\d;]*m)?\((?:[\w.:]+ )?pid=\d+(?:, ip=[\d.]+)?\)(?:\x1b\[[\d;]*m)? ")
CONTEXT_LINES = 30
TRACEBACK = "Traceback (most recent call last)"
#: What separates the tracebacks of a chained exception (Python prints a blank line around it).
CHAINED = ("During handling of the above exception", "The above exception was the direct cause")
TAIL_LINES = 60


def _split(line: str) -> tuple[str, str]:
    """(the line's prefixes, its text): vLLM's engine core writes ``(EngineCore pid=N)`` into the engine
    actor's output, which Ray prefixes again."""
    prefixes = ""
    while match := PREFIX.match(line, len(prefixes)):
        prefixes = line[: match.end()]
    return prefixes, line[len(prefixes) :]


def _body(line: str) -> str:
    return _split(line)[1]


def first_error(log: str) -> tuple[int, str] | None:
    """(1-based line number, the error's lines) of the first error in ``log``; None if none.

    A Python traceback is taken whole, through its exception line (and a chained one); anything else
    with the lines that follow it from the same process, up to :data:`CONTEXT_LINES`.
    """
    lines = log.splitlines()
    for i, line in enumerate(lines):
        body = _body(line)
        if not ERROR_START.search(body) or any(s in body for s in NOT_ERRORS):
            continue
        # only this process's lines (Ray interleaves the others'): the same prefixes (none: the driver)
        prefixes = _split(line)[0]
        same = [j for j in range(i, len(lines)) if _split(lines[j])[0] == prefixes]
        return i + 1, "\n".join(lines[j] for j in _block(lines, same))
    return None


def _block(lines: list[str], indices: list[int]) -> list[int]:
    """Up to :data:`CONTEXT_LINES` of the lines at ``indices``; a traceback among them ends the block
    with it (a logged error followed by its traceback, as ``logger.exception`` prints)."""
    picked: list[int] = []
    for k, j in enumerate(indices[:CONTEXT_LINES]):
        if TRACEBACK in _body(lines[j]):
            return picked + _traceback(lines, indices[k:])
        picked.append(j)
    return picked


def _traceback(lines: list[str], indices: list[int]) -> list[int]:
    """The traceback at ``indices[0]``: its frames, its exception line and the lines up to the next blank
    one, and a chained traceback (``During handling of ...``) after that blank line."""
    picked: list[int] = []
    in_frames = True
    for k, j in enumerate(indices[: CONTEXT_LINES * 4]):
        body = _body(lines[j])
        if not in_frames and not body.strip():
            after = next((_body(lines[n]) for n in indices[k + 1 :] if _body(lines[n]).strip()), "")
            if not after.startswith((*CHAINED, TRACEBACK)):
                break
        picked.append(j)
        if body.startswith(TRACEBACK):
            in_frames = True
        elif in_frames and body and not body[0].isspace():
            in_frames = False  # the exception line
    return picked


def explain(log: str, what: str = "the run") -> str:
    """A failure message: the first error (or that none was found) and the log's last lines."""
    found = first_error(log)
    lines = log.splitlines()
    head = (
        f"first error of {what} (log line {found[0]} of {len(lines)}):\n{found[1]}"
        if found
        else f"no error line in {what}'s log ({len(lines)} lines)"
    )
    return f"{head}\n--- the log's last {TAIL_LINES} lines:\n" + "\n".join(lines[-TAIL_LINES:])
