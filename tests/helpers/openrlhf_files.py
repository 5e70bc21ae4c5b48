"""OpenRLHF's own ``openrlhf/models/<name>.py``, loaded by file path under a private package name:
``openrlhf.models``' ``__init__`` imports flash_attn (absent on CPU), and nothing is registered as
``openrlhf.models``. The core tests compare against these files' functions."""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import pytest

_PKG = "_rpg_test_openrlhf_models"


def openrlhf_models_file(name: str) -> types.ModuleType:
    """The module of ``openrlhf/models/{name}.py`` (its ``from .utils`` imports resolve to the same
    private package); skips the test where OpenRLHF is not installed."""
    if f"{_PKG}.{name}" in sys.modules:
        return sys.modules[f"{_PKG}.{name}"]
    spec = importlib.util.find_spec("openrlhf")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("openrlhf is not installed")
    root = Path(list(spec.submodule_search_locations)[0]) / "models"
    if _PKG not in sys.modules:
        package = types.ModuleType(_PKG)
        package.__path__ = [str(root)]
        sys.modules[_PKG] = package
    file_spec = importlib.util.spec_from_file_location(f"{_PKG}.{name}", root / f"{name}.py")
    module = importlib.util.module_from_spec(file_spec)
    sys.modules[file_spec.name] = module
    file_spec.loader.exec_module(module)
    return module
