"""Cosmetic items of issue 31: no library noise before rpg-train's error line (bitsandbytes' optional
CPU 4-bit kernel), and ``rpg-eval run --run ""`` refused at parse time (a run named nothing)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from test_eval_cli import _lines, _run

from rpg_openrlhf.common.cliutil import BNB_CPU_LOGGER


def test_rpg_train_silences_the_bitsandbytes_cpu_kernel_warning(capsys) -> None:
    from rpg_openrlhf.launch.cli import main

    logger = logging.getLogger(BNB_CPU_LOGGER)
    logger.setLevel(logging.NOTSET)
    with pytest.raises(SystemExit):
        main(["--no-such-flag"])
    capsys.readouterr()
    assert not logger.isEnabledFor(logging.WARNING)  # what bitsandbytes logs it at
    assert logger.isEnabledFor(logging.ERROR)


def test_rpg_eval_refuses_an_empty_run_name(tmp_path: Path, capsys) -> None:
    from rpg_eval.cli import main

    assert main([*_run(tmp_path), "--run", "  "]) == 2
    (line,) = _lines(capsys.readouterr().err)
    assert "--run" in line and "non-empty" in line, line
    assert not (tmp_path / "o").exists()
