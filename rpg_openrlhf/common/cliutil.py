"""Command-line plumbing shared by the commands (rpg-eval's subcommands, rpg-prepare-data, rpg-mechanisms).

* argparse ``type=`` checkers, so a bad number is refused at parse time, before a model loads or
  a file is written: ``int_at_least(1)``, ``float_in(0, 1, low_open=True)``, ``nonblank``, ...
* ``OneLineParser``: an ArgumentParser whose errors are one line ``PROG: error: MESSAGE`` (no
  usage block) and that takes no abbreviations (``--tem`` is not ``--temperature``: a typo must
  not be a flag).
* ``report_errors``: one line ``PROG: error: MESSAGE`` and exit status 2 for every failure;
  ``--debug`` (anywhere on the command line) or ``RPG_DEBUG=1`` shows the traceback instead.
* ``load_json``: one JSON document (a line of a jsonl file) or an error naming where it is, for
  every way a hostile file can fail (bad UTF-8, a 5,000-digit number, 100,000 nested arrays).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import traceback
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NoReturn

DEBUG_FLAG = "--debug"
DEBUG_ENV = "RPG_DEBUG"


def int_at_least(low: int) -> Callable[[str], int]:
    """argparse type: an integer >= ``low``."""

    def check(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value

    check.__name__ = f"integer >= {low}"
    return check


def int_in(low: int, high: int) -> Callable[[str], int]:
    """argparse type: an integer in [``low``, ``high``]."""
    at_least = int_at_least(low)

    def check(text: str) -> int:
        value = at_least(text)
        if value > high:
            raise argparse.ArgumentTypeError(f"must be <= {high}, got {value}")
        return value

    check.__name__ = f"integer in [{low}, {high}]"
    return check


def float_in(
    low: float, high: float = math.inf, low_open: bool = False, high_open: bool = False
) -> Callable[[str], float]:
    """argparse type: a finite float in the interval (``low_open``/``high_open`` exclude ends)."""
    lb, rb = "(" if low_open else "[", ")" if high_open or high == math.inf else "]"
    interval = f"{lb}{low:g}, {high:g}{rb}"

    def check(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        ok = math.isfinite(value) and (value > low if low_open else value >= low)
        ok = ok and (value < high if high_open else value <= high)
        if not ok:
            raise argparse.ArgumentTypeError(f"must be in {interval}, got {text}")
        return value

    check.__name__ = f"number in {interval}"
    return check


def nonblank(text: str) -> str:
    """argparse type: a string with something in it (``--run ""`` would name a run with nothing)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"expected a non-empty name, got {text!r}")
    return text


nonblank.__name__ = "non-empty name"


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser for the project's commands: a usage error is one line ``PROG: error:
    MESSAGE`` and exit status 2 (``--help`` still shows the usage), and options are never
    abbreviated (``allow_abbrev=False``; subparsers inherit both)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        """Print one line and exit 2 (argparse prints its usage block first)."""
        print(f"{self.prog}: error: {' '.join(message.split())}", file=sys.stderr)
        sys.exit(2)


NEWLINE = b"\n"


class LongNumber(str):
    """An integer in JSON with more digits than ``int()`` converts (Python's 4,300-digit limit):
    kept as its digits (a string), so a long integer answer is still an answer."""


def _parse_int(text: str) -> int | str:
    limit = sys.get_int_max_str_digits()
    if limit and len(text) - text.startswith("-") > limit:
        return LongNumber(text)
    return int(text)


def load_json(
    raw: str | bytes, where: str, error: type[ValueError] = ValueError, multiline: bool = False
) -> Any:
    """``json.loads(raw)`` (integers beyond ``int()``'s digit limit kept as LongNumber strings),
    or ``error("WHERE: what is wrong")`` for every way it can fail: invalid JSON, bytes that are
    not UTF-8, nesting deeper than the parser's recursion limit. ``multiline``: ``raw`` is a whole
    file, and the message names the line (``WHERE:LINE``)."""
    try:
        return json.loads(raw, parse_int=_parse_int)
    except json.JSONDecodeError as e:
        raise error(f"{where}{f':{e.lineno}' if multiline else ''}: invalid JSON ({e.msg})") from None
    except UnicodeDecodeError as e:
        line = ""
        if multiline and isinstance(raw, bytes):
            line = f":{raw.count(NEWLINE, 0, e.start) + 1}"
        raise error(f"{where}{line}: not valid UTF-8") from None
    except RecursionError:
        raise error(f"{where}: JSON nested too deeply to read (thousands of levels)") from None


def pop_debug(argv: list[str]) -> bool:
    """Remove every ``--debug`` from ``argv``; True if there was one or RPG_DEBUG is set."""
    found = DEBUG_FLAG in argv
    argv[:] = [a for a in argv if a != DEBUG_FLAG]
    return found or os.environ.get(DEBUG_ENV, "") not in ("", "0")


def describe(exc: BaseException) -> str:
    """One line for an exception: the message of an expected failure (bad input: ValueError and
    its subclasses, a missing or unreadable file), else the type and a hint at --debug."""
    if isinstance(exc, OSError) and exc.filename is not None:
        text = f"{exc.filename}: {exc.strerror or exc}"
    elif isinstance(exc, (ValueError, OSError)) and str(exc):
        text = str(exc)
    else:
        text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        text += f" (rerun with {DEBUG_FLAG} or {DEBUG_ENV}=1 for the traceback)"
    return " ".join(text.split())  # one line


#: bitsandbytes' CPU backend logs, at import on CPUs with AVX512-BF16, "Failed to load CPU
#: gemm_4bit_forward from kernels-community" when it cannot fetch that optional 4-bit kernel (offline,
#: or without the ``kernels`` package). Nothing here runs 4-bit layers, so it preceded every rpg-train
#: error line with noise; its errors (level ERROR and above) still show.
BNB_CPU_LOGGER = "bitsandbytes.backends.cpu.ops"


def quiet_known_warnings() -> None:
    """Silence library warnings that say nothing about the user's command (printed before the
    error line otherwise): torch's "The pynvml package is deprecated" FutureWarning, and
    bitsandbytes' warning about its optional CPU 4-bit kernel (:data:`BNB_CPU_LOGGER`)."""
    import logging

    warnings.filterwarnings("ignore", message="The pynvml package is deprecated", category=FutureWarning)
    logging.getLogger(BNB_CPU_LOGGER).setLevel(logging.ERROR)


def report_errors(prog: str, body: Callable[[list[str]], int], argv: Sequence[str] | None = None) -> int:
    """Run ``body(argv)``; any exception becomes ``PROG: error: ...`` on stderr and exit 2
    (Ctrl-C: 130), unless debugging was asked for (then the traceback is printed)."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = pop_debug(args)
    quiet_known_warnings()
    try:
        return body(args)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except SystemExit as e:  # argparse (already one line) or a SystemExit("message")
        if isinstance(e.code, str):
            print(f"{prog}: error: {e.code}", file=sys.stderr)
            return 2
        return int(e.code or 0)
    except Exception as e:  # noqa: BLE001 - the one place that turns failures into a line
        if debug:
            traceback.print_exc()
        print(f"{prog}: error: {describe(e)}", file=sys.stderr)
        return 2


def causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and every exception behind it: its ``__cause__`` / ``__context__`` chain, the ``cause``
    that Ray's task and actor errors keep and exceptions passed as arguments, each once."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo += [e.__cause__, e.__context__, getattr(e, "cause", None)]
        todo += [a for a in getattr(e, "args", ()) if isinstance(a, BaseException)]
