"""Shared fixtures. tests/ is not a package: the openrlhf wheel installs a top-level `tests`.
Helper modules and worker scripts the tests share live in tests/helpers/ (on sys.path here)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# Nothing may be fetched from a hub at run time; set before transformers/datasets import.
for _k, _v in {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "RAY_USAGE_STATS_ENABLED": "0",
    "WANDB_MODE": "offline",
    "DS_ACCELERATOR": "cpu",
    "DS_BUILD_OPS": "0",
}.items():
    os.environ.setdefault(_k, _v)

# The suite does not depend on how it was started: a cluster named by the caller's RAY_ADDRESS is not
# joined (the tests that join one start it and name it themselves), and a closed stdin (``<&-``) is
# /dev/null, so the first file a test opens does not become fd 0. Signal dispositions are left as
# inherited on purpose: the product must work under nohup (tests/test_watchdog.py starts under nohup).
os.environ.pop("RAY_ADDRESS", None)
try:
    os.fstat(0)
except OSError:
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent / "helpers"))
SHARED = REPO.parent / "shared"
SHARED_DATA = SHARED / "data"
MISSING_SHARED = (
    f"{SHARED_DATA} is missing: the tests that read the benchmark files (AIME24/25, AMC23, DAPO-Math-17k) "
    f"look for them in ../shared/data beside the clone: link a folder that holds data/ there (ln -s DIR {SHARED})"
)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The benchmark files kept outside the project (never copied into it)."""
    if not SHARED_DATA.is_dir():
        pytest.fail(MISSING_SHARED)
    return SHARED_DATA


def _reads_shared(item: pytest.Item) -> bool:
    """Whether a test reads ../shared: it asks for the fixture, or its module holds a path under it."""
    if "shared_data" in getattr(item, "fixturenames", ()):
        return True
    module = getattr(item, "module", None)
    return (
        any(isinstance(value, Path) and value.is_relative_to(SHARED) for value in vars(module).values())
        if module
        else False
    )


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random-init Qwen2 model with a byte-level char tokenizer, built once per session."""
    from rpg_openrlhf.tinymodel import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny_model"), seed=0)


@pytest.fixture(scope="session")
def tiny_vllm_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with head size 32 (2 heads), which vLLM's CPU attention supports (16 it does not)."""
    from rpg_openrlhf.tinymodel import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny_vllm_model"), seed=0, heads=2, kv_heads=1)


#: The files that run longest (whole seconds on a quiet 2-core machine, `--durations=0`), started first
#: so that under `make test` (two xdist workers, one file per worker at a time) the longest one is not
#: left for last. Any other file with an e2e or slow test follows, then the rest, in name order.
LONGEST_FIRST = (
    "test_e2e_preemption.py",
    "test_demo.py",
    "test_e2e_offpolicy.py",
    "test_e2e_ranks.py",
    "test_e2e_cluster.py",
    # quick by marker, but minutes each: DeepSpeed ranks, OpenRLHF's partitioner, dry-run subprocesses
    "test_memory_plan_terms.py",
    "test_configs.py",
    "test_gpu_tier.py",
    "test_memory_plan.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Longest files first (LONGEST_FIRST), then files with an e2e or slow test; order within a file kept."""
    heavy = {
        item.path.name for item in items if item.get_closest_marker("e2e") or item.get_closest_marker("slow")
    }

    def rank(item: pytest.Item) -> tuple[int, int]:
        name = item.path.name
        if name in LONGEST_FIRST:
            return 0, LONGEST_FIRST.index(name)
        return (1, 0) if name in heavy else (2, 0)

    items.sort(key=rank)  # stable: a file's tests keep their order
    if not SHARED_DATA.is_dir():
        # Outside this repository's usual layout the tests that need the benchmark files skip, saying so
        # once each; CI, whose checkout always has them, fails them instead (the fixture's message).
        mark = (
            pytest.mark.usefixtures("shared_data")
            if os.environ.get("CI")
            else pytest.mark.skip(MISSING_SHARED)
        )
        for item in items:
            if _reads_shared(item):
                item.add_marker(mark)
