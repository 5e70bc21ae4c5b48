"""DeepSpeed's CPU ops from a checkout whose path has a space in it.

torch's JIT extension builder quotes the include paths it writes into ``build.ninja`` but not the
link flags: ``cpp_extension._prepare_ldflags`` appends ``-L<torch>/lib`` as it is, so under
``/home/me/my runs/.venv`` the linker reads ``-L/home/me/my`` and stops with ``cannot find
-ltorch_cpu``. :func:`install` quotes every link flag that holds whitespace, once torch's module is
imported.

Every process that loads an op must write the same ``build.ninja`` (ninja relinks when the command
line changes), so the hook cannot live in one entry point: ``make setup`` (:func:`write_pth`) puts a
one-line ``.pth`` in the venv, which Python runs at start-up in every process of that venv (set-up, Ray
workers, vLLM engines, the tests' DeepSpeed ranks). It imports this module only when the venv's own
path holds whitespace, so other checkouts pay nothing.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import shlex
import sys
import sysconfig
from pathlib import Path
from types import ModuleType

TARGET = "torch.utils.cpp_extension"
PTH_NAME = "rpg_openrlhf_quoted_ldflags.pth"
#: What the ``.pth`` runs at every start-up of the venv's Python (a ``.pth`` line must start with "import").
PTH_LINE = (
    "import sys; any(c.isspace() for c in sys.prefix) and "
    "__import__('rpg_openrlhf.cpu_backend.quoted_ldflags', fromlist=['install']).install()\n"
)


def quote_flags(flags: list[str]) -> list[str]:
    """The link flags with each one that holds whitespace quoted for the shell ninja runs."""
    return [shlex.quote(flag) if any(c.isspace() for c in flag) else flag for flag in flags]


def patch(cpp_extension: ModuleType) -> None:
    """Wrap ``cpp_extension._prepare_ldflags`` so that what it returns is quoted (idempotent)."""
    prepare = cpp_extension._prepare_ldflags
    if getattr(prepare, "quotes_whitespace", False):
        return

    def prepare_quoted(*args, **kwargs):  # type: ignore[no-untyped-def]
        return quote_flags(prepare(*args, **kwargs))

    prepare_quoted.quotes_whitespace = True  # type: ignore[attr-defined]
    cpp_extension._prepare_ldflags = prepare_quoted


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: hands torch's module to its own loader, then patches it once run."""

    def find_spec(self, name, path, target=None):  # type: ignore[no-untyped-def]
        if name != TARGET:
            return None
        sys.meta_path.remove(self)  # find the real spec with the other finders
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            patch(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def install() -> None:
    """Quote torch's link flags in this process, now if torch's builder is loaded, else on its import."""
    if TARGET in sys.modules:
        patch(sys.modules[TARGET])
    elif not any(isinstance(finder, _PatchOnImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport())


def write_pth(site_packages: Path | None = None) -> Path:
    """Write the start-up line into the venv's site-packages (``make setup``); returns its path."""
    folder = Path(site_packages or sysconfig.get_paths()["purelib"])
    path = folder / PTH_NAME
    path.write_text(PTH_LINE)
    return path
