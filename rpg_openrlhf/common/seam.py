"""The seam registry: every place this project replaces, temporarily swaps or relies on a private
part of a third-party object (OpenRLHF, DeepSpeed, vLLM, lm-eval, Ray, torch, argparse).

Each package declares its own entries beside its code, in its ``patches.py``
(:data:`DECLARED_IN` lists them; :func:`registry` is their union, the one registry). A
:class:`Patch` says what is replaced, by what, why, why no extension point of the upstream can do
it, and which upstream function it was checked against: the function's signature and the source
lines the patch depends on (``anchors``) are hashed into ``fingerprint`` (upstream at the versions
of :data:`FINGERPRINTED_AT`). ``tests/test_seam.py`` recomputes every fingerprint from the
installed upstream source, so an upgrade names exactly the patches to re-check; then
``python -m rpg_openrlhf.common.seam --fingerprints`` prints the new values.

Kinds: ``replace`` (a module or class attribute replaced for the process; applied only through
:func:`apply`, per stage), ``scoped`` (swapped for one call with :func:`swapped`, restored after),
``private`` (a private upstream name read or called, nothing replaced), ``override`` (a subclass
method through an upstream extension point: not a patch, fingerprinted because it depends on the
parent's code). The table in docs/contracts.md is ``python -m rpg_openrlhf.common.seam --table``.

A package applies its ``replace`` entries of one stage with ``apply(PATCHES, stage)`` (each entry names
its stage: the plug-in's ``rpg``, the extras' ``trainer``, the CPU backend's ``cpu-driver`` /
``cpu-worker`` as post-import hooks, ...: ``--table`` lists them).

This module imports nothing heavy (the CPU backend's worker hook runs it in every Ray worker).
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

#: Distribution -> the versions the training side's patches were checked against (rpg-train and
#: the CPU backend check them at start-up with :func:`rpg_openrlhf.common.versions.check`;
#: RPG_ALLOW_UNCHECKED_VERSIONS=1 turns the error into a warning). rpg-eval checks its own set.
CHECKED_VERSIONS: dict[str, tuple[str, ...]] = {
    "openrlhf": ("0.11.2",),
    "deepspeed": ("0.19.6",),
    "vllm": ("0.29.0",),
}
#: Versions the fingerprints were taken at, for every package a patch reaches into.
FINGERPRINTED_AT: dict[str, str] = {
    "openrlhf": "0.11.2",
    "deepspeed": "0.19.6",
    "vllm": "0.29.0",
    "lm_eval": "0.4.13",
    "ray": "2.55.0",
    "torch": "2.13.0",
    "transformers": "5.15.0",
    "argparse": "python 3.11",
}
KINDS = ("replace", "scoped", "private", "override")
#: Upstream names the declarations share.
TRAIN_PPO_RAY = "openrlhf.cli.train_ppo_ray"
PPO_ACTOR = "openrlhf.trainer.ray.ppo_actor"
CLASS_BY_NAME = (
    "train_ppo_ray's train() instantiates the classes it imported by name; OpenRLHF has no option "
    "or registry for the actor / trainer classes"
)
#: The modules that declare patches (each a ``PATCHES`` tuple of plain data, importable anywhere).
DECLARED_IN = (
    "rpg_openrlhf.common.patches",
    "rpg_openrlhf.plugin.patches",
    "rpg_openrlhf.extras.patches",
    "rpg_openrlhf.cpu_backend.patches",
    "rpg_eval.run.patches",
)


@dataclass(frozen=True, kw_only=True)
class Patch:
    """One point where this project reaches into a third-party package (declared with keywords)."""

    key: str
    kind: str  # one of KINDS
    package: str  # distribution the upstream belongs to (a FINGERPRINTED_AT key)
    target: str  # what is replaced / read / overridden
    replacement: str = ""  # what replaces it ("" for private reads)
    why: str
    why_no_extension_point: str  # why no upstream extension point can do it
    upstream: str  # "module:qualname" whose source is fingerprinted ("module:" = the whole module)
    anchors: tuple[str, ...]  # substrings of the upstream lines the patch depends on
    fingerprint: str
    stage: str | None = None  # replace: the apply() stage
    apply: str | None = None  # replace: "module:function(module)" doing it
    hook_module: str | None = None  # replace: the module handed to ``apply`` (imported, or awaited)


def registry() -> tuple[Patch, ...]:
    """Every declared patch, in the order of :data:`DECLARED_IN` (the one registry)."""
    return tuple(p for name in DECLARED_IN for p in importlib.import_module(name).PATCHES)


# ----------------------------------------------------------------------------- fingerprints
def _source_file(module: str) -> Path:
    """The source file of ``module`` found without importing it or its parent packages."""
    top, *rest = module.split(".")
    spec = importlib.util.find_spec(top)  # a top-level name: finds, imports nothing
    if spec is None or not spec.origin:
        raise LookupError(f"module {module} not found")
    base = Path(spec.origin)
    if not rest:
        return base
    path = base.parent.joinpath(*rest)
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate
    raise LookupError(f"module {module} not found under {base.parent}")


def upstream_source(upstream: str, origin: str | Path | None = None) -> tuple[str, list[str]]:
    """(signature, source lines) of ``"module:qualname"`` read from its source file, not imported.

    ``origin``: read that file instead of the installed module's (tests: a modified copy).
    """
    module, _, qualname = upstream.partition(":")
    origin = _source_file(module) if origin is None else origin
    text = Path(origin).read_text(encoding="utf-8")
    lines = text.splitlines()
    if not qualname:
        return "", lines
    node: Any = ast.parse(text)
    for part in qualname.split("."):
        found = [
            n
            for n in getattr(node, "body", [])
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and n.name == part
        ]
        if not found:
            raise LookupError(f"{upstream}: {part!r} not found in {origin}")
        node = found[-1]
    signature = "" if isinstance(node, ast.ClassDef) else ast.unparse(node.args)
    return signature, lines[node.lineno - 1 : node.end_lineno]


def fingerprint_of(upstream: str, anchors: tuple[str, ...], origin: str | Path | None = None) -> str:
    """sha256 of the signature and of every line holding an anchor (16 hex digits).

    Raises LookupError naming an anchor that no line holds any more.
    """
    signature, lines = upstream_source(upstream, origin)
    picked = []
    for anchor in anchors:
        hits = [line.strip() for line in lines if anchor in line]
        if not hits:
            raise LookupError(f"{upstream}: no line holds {anchor!r} any more")
        picked.append(hits)
    blob = json.dumps([signature, picked])
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def check_patch(patch: Patch, origin: str | Path | None = None) -> str | None:
    """None when the upstream still matches ``patch``; else what changed and what to re-check."""
    try:
        now = fingerprint_of(patch.upstream, patch.anchors, origin)
    except LookupError as exc:
        return f"[{patch.key}] {exc}; re-check: {patch.why}"
    if now == patch.fingerprint:
        return None
    signature, _ = upstream_source(patch.upstream, origin)
    return (
        f"[{patch.key}] {patch.upstream} changed (fingerprint {patch.fingerprint} -> {now}; signature "
        f"now ({signature}); lines holding {list(patch.anchors)}). Re-check: {patch.target} -> "
        f"{patch.replacement or '(read)'}: {patch.why}"
    )


# ----------------------------------------------------------------------------- applying
_HOOKS: dict[str, list[Callable[[ModuleType], None]]] = {}
_APPLIED: set[tuple[str, str]] = set()
_LOCK = threading.RLock()


def _run_hooks(module: ModuleType) -> None:
    with _LOCK:
        for hook in _HOOKS.get(module.__name__, []):
            key = (module.__name__, f"{hook.__module__}.{hook.__qualname__}")
            if key not in _APPLIED:
                _APPLIED.add(key)
                hook(module)


class _HookedLoader(importlib.abc.Loader):
    """Wraps a module's real loader and runs the registered patches right after it executes."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        _run_hooks(module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename, is_package, ...
        return getattr(self._loader, name)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Finds hooked modules through the other finders and wraps their loaders.

    Hand-written rather than ``wrapt.register_post_import_hook``: importing wrapt costs every Ray
    worker ~40-80 ms more (bench/post_import_hooks.py: x2.7 the time of this finder)."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in _HOOKS:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and not isinstance(spec.loader, _HookedLoader):
                    spec.loader = _HookedLoader(spec.loader)
                return spec
        return None


def when_imported(module_name: str, hook: Callable[[ModuleType], None]) -> None:
    """Run ``hook(module)`` once, right after ``module_name`` is imported (now if it already is)."""
    with _LOCK:
        _HOOKS.setdefault(module_name, [])
        if hook not in _HOOKS[module_name]:
            _HOOKS[module_name].append(hook)
        if not any(isinstance(f, _PostImportFinder) for f in sys.meta_path):
            sys.meta_path.insert(0, _PostImportFinder())
    module = sys.modules.get(module_name)
    if module is not None:
        _run_hooks(module)


def _resolve(path: str) -> Callable[[ModuleType], None]:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def apply(patches: Iterable[Patch], stage: str, lazy: bool = False) -> list[str]:
    """Apply every ``replace`` patch of ``stage`` among ``patches`` (a package's own); returns their keys.

    ``lazy``: as post-import hooks (each when its module is first imported, now if it already is);
    else the module is imported now. A stage with no patch is an error (a misspelt stage).
    """
    done = []
    for patch in patches:
        if patch.stage != stage:
            continue
        assert patch.apply and patch.hook_module, patch.key
        hook = _resolve(patch.apply)
        if lazy:
            when_imported(patch.hook_module, hook)
        else:
            hook(importlib.import_module(patch.hook_module))
        done.append(patch.key)
    if not done:
        raise ValueError(f"stage {stage!r}: no patch of these is applied in that stage")
    return done


@contextlib.contextmanager
def swapped(obj: Any, **values: Any) -> Iterator[None]:
    """Set attributes of ``obj`` for the duration of the block, restored after (every scoped patch)."""
    old = {k: getattr(obj, k) for k in values}
    for k, v in values.items():
        setattr(obj, k, v)
    try:
        yield
    finally:
        for k, v in old.items():
            setattr(obj, k, v)


def table() -> str:
    """The Markdown table of docs/contracts.md, "The seam": what each patch changes and why (what replaces
    it and why upstream has no extension point for it stay beside its code, in the registry)."""
    rows = [
        "| key | kind | upstream (package) | why |",
        "|---|---|---|---|",
    ]
    for p in registry():
        where = f" (stage `{p.stage}`)" if p.stage else ""
        cells = [f"`{p.key}`", p.kind + where, f"`{p.target}` ({p.package})", p.why]
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows)


def _main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m rpg_openrlhf.common.seam", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--table", action="store_true", help="print the Markdown table of docs/contracts.md")
    parser.add_argument("--fingerprints", action="store_true", help="print each patch's current fingerprint")
    args = parser.parse_args(argv)
    if args.table:
        print(table())
    if args.fingerprints:
        for p in registry():
            try:
                now = fingerprint_of(p.upstream, p.anchors)
            except LookupError as exc:
                now = f"ERROR {exc}"
            print(f"{p.key:24s} {now} {'ok' if now == p.fingerprint else 'CHANGED'}")


if __name__ == "__main__":
    _main()
