"""torch's C++ builds from a checkout whose path has a space in it.

Two of torch's builders quote the include paths they write but not the library paths, so under
``/home/me/my runs/.venv`` the linker reads ``-L/home/me/my`` (``cannot find -ltorch_cpu``): the JIT
extension builder's ``cpp_extension._prepare_ldflags`` (DeepSpeed's CPU ops) and inductor's
``cpp_builder.CppBuilder`` (vLLM's ``torch.compile``d CPU sampler: an engine dies at its first request).
:func:`install` quotes every such flag that holds whitespace, once torch's module is imported.

Every process that builds must quote the same way (ninja relinks when the command line changes) and
engines start in processes of their own, so ``make setup`` (:func:`write_pth`) puts a one-line ``.pth``
in the venv, which Python runs at every start-up there; it imports this module only when the venv's
own path holds whitespace, so other checkouts pay nothing.
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

JIT_BUILDER = "torch.utils.cpp_extension"
INDUCTOR_BUILDER = "torch._inductor.cpp_builder"
PTH_NAME = "rpg_openrlhf_quoted_ldflags.pth"
#: What the ``.pth`` runs at every start-up of the venv's Python (a ``.pth`` line must start with "import").
PTH_LINE = (
    "import sys; any(c.isspace() for c in sys.prefix) and "
    "__import__('rpg_openrlhf.cpu_backend.quoted_ldflags', fromlist=['install']).install()\n"
)


def quote_flags(flags: list[str]) -> list[str]:
    """The link flags with each one that holds whitespace quoted for the shell ninja runs."""
    return [shlex.quote(flag) if any(c.isspace() for c in flag) else flag for flag in flags]


def patch_jit(cpp_extension: ModuleType) -> None:
    """Wrap ``cpp_extension._prepare_ldflags`` so that what it returns is quoted (idempotent)."""
    prepare = cpp_extension._prepare_ldflags
    if getattr(prepare, "quotes_whitespace", False):
        return

    def prepare_quoted(*args, **kwargs):  # type: ignore[no-untyped-def]
        return quote_flags(prepare(*args, **kwargs))

    prepare_quoted.quotes_whitespace = True  # type: ignore[attr-defined]
    cpp_extension._prepare_ldflags = prepare_quoted


def patch_inductor(cpp_builder: ModuleType) -> None:
    """Quote the ``-L`` flags ``CppBuilder`` writes into its command (idempotent)."""
    init = cpp_builder.CppBuilder.__init__
    if getattr(init, "quotes_whitespace", False) or cpp_builder._IS_WINDOWS:  # Windows quotes its own
        return

    def init_quoted(self, name, sources, BuildOption, *args, **kwargs):  # type: ignore[no-untyped-def]  # noqa: N803
        init(self, name, sources, BuildOption, *args, **kwargs)
        dirs = quote_flags([f"-L{folder}" for folder in BuildOption.get_libraries_dirs()])
        self._libraries_dirs_args = "".join(f"{flag} " for flag in dirs)

    init_quoted.quotes_whitespace = True  # type: ignore[attr-defined]
    cpp_builder.CppBuilder.__init__ = init_quoted


#: The modules patched, each by its function, once imported.
PATCHES = {JIT_BUILDER: patch_jit, INDUCTOR_BUILDER: patch_inductor}


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: hands each of torch's builders to its own loader, then patches it once run."""

    def __init__(self) -> None:
        self.found: set[str] = set()  # asked once each: the finders behind this one give the real spec

    def find_spec(self, name, path, target=None):  # type: ignore[no-untyped-def]
        if name not in PATCHES or name in self.found:
            return None
        self.found.add(name)  # find the real spec with the other finders
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            PATCHES[name](module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def install() -> None:
    """Quote torch's link flags in this process: now in each builder already loaded, else on its import."""
    for name, patch in PATCHES.items():
        if name in sys.modules:
            patch(sys.modules[name])
    if not any(isinstance(finder, _PatchOnImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport())


def write_pth(site_packages: Path | None = None) -> Path:
    """Write the start-up line into the venv's site-packages (``make setup``); returns its path."""
    folder = Path(site_packages or sysconfig.get_paths()["purelib"])
    path = folder / PTH_NAME
    path.write_text(PTH_LINE)
    return path
