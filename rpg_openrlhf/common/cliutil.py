"""Command-line plumbing shared by the commands (rpg-eval's subcommands, rpg-prepare-data, rpg-mechanisms).

* argparse ``type=`` checkers, so a bad number is refused at parse time, before a model loads or
  a file is written: ``int_at_least(1)``, ``float_in(0, 1, low_open=True)``, ...
* ``report_errors``: one line ``PROG: error: MESSAGE`` and exit status 2 for every failure;
  ``--debug`` (anywhere on the command line) or ``RPG_DEBUG=1`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import traceback
from collections.abc import Callable, Sequence

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


def report_errors(prog: str, body: Callable[[list[str]], int], argv: Sequence[str] | None = None) -> int:
    """Run ``body(argv)``; any exception becomes ``PROG: error: ...`` on stderr and exit 2
    (Ctrl-C: 130), unless debugging was asked for (then the traceback is printed)."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = pop_debug(args)
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
