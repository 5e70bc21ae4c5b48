"""A module run as ``__main__`` (as ``python -m`` runs it) with its module-level imports of packages
outside the standard library deferred until the caller asks for them.

Why: ``openrlhf.cli.train_ppo_ray`` imports Ray and OpenRLHF's trainer (and through them DeepSpeed and
vLLM, about 10 CPU-s) at module level, yet builds and checks its parser in its ``__main__`` block,
which uses none of them. Running the module's own statements in their order, minus those imports,
answers ``--help`` and a usage error with OpenRLHF's parser exactly as the module builds it; the
imports run, the same statements in the same namespace, when training starts
(:meth:`DeferredMain.import_deferred`). A statement that used a deferred name before that fails with
``NameError`` naming it, never with another value.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from importlib.machinery import ModuleSpec
from types import CodeType, ModuleType


def is_deferred(node: ast.stmt) -> bool:
    """A module-level import of anything outside the standard library (relative imports included)."""
    if isinstance(node, ast.Import):
        return any(alias.name.split(".")[0] not in sys.stdlib_module_names for alias in node.names)
    if isinstance(node, ast.ImportFrom):
        return node.level > 0 or (node.module or "").split(".")[0] not in sys.stdlib_module_names
    return False


@dataclass(frozen=True)
class DeferredMain:
    """One module's code split in two: ``body`` (every statement but the deferred imports, in order)
    and ``imports`` (the deferred imports, in order), both compiled from the module's own source with
    its file name and line numbers, so tracebacks point into it."""

    spec: ModuleSpec
    body: CodeType
    imports: CodeType

    @classmethod
    def load(cls, name: str) -> DeferredMain:
        """Read and split ``name``'s source (its parent packages are imported, the module is not)."""
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or spec.origin is None:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        source = spec.loader.get_source(name)  # type: ignore[attr-defined]
        tree = ast.parse(source, spec.origin)
        late = [node for node in tree.body if is_deferred(node)]
        now = [node for node in tree.body if not is_deferred(node)]

        def code(nodes: list[ast.stmt]) -> CodeType:
            return compile(ast.Module(body=nodes, type_ignores=[]), spec.origin, "exec")

        return cls(spec, code(now), code(late))

    def new_module(self) -> ModuleType:
        """The ``__main__`` module the code runs in (the attributes runpy gives it)."""
        module = ModuleType("__main__")
        module.__file__ = self.spec.origin
        module.__spec__ = self.spec
        module.__loader__ = self.spec.loader
        module.__package__ = self.spec.parent
        module.__cached__ = self.spec.cached  # type: ignore[attr-defined]
        return module

    def run(self, module: ModuleType, argv: Sequence[str]) -> None:
        """Run the body in ``module`` as ``__main__`` with ``sys.argv = [file, *argv]`` (both restored)."""
        with _as_main(module, [str(self.spec.origin), *argv]):
            exec(self.body, vars(module))

    def import_deferred(self, namespace: dict) -> None:
        """Run the deferred imports in ``namespace``: the module's names as its import would bind them."""
        exec(self.imports, namespace)


@contextlib.contextmanager
def _as_main(module: ModuleType, argv: list[str]) -> Iterator[None]:
    """``sys.modules["__main__"]`` and ``sys.argv`` for one block, as ``runpy.run_module(..., alter_sys=True)``."""
    saved_main, saved_argv = sys.modules.get("__main__"), sys.argv
    sys.modules["__main__"], sys.argv = module, argv
    try:
        yield
    finally:
        sys.argv = saved_argv
        if saved_main is None:
            del sys.modules["__main__"]
        else:
            sys.modules["__main__"] = saved_main
