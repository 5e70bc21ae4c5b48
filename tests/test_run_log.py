"""An E2E failure shows the run's FIRST error (tests/helpers/run_log.py): the engine's or a worker's,
whole and without the lines other processes interleaved, not the tail of later consequences."""

from __future__ import annotations

from run_log import TAIL_LINES, explain, first_error

ENGINE = "\x1b[36m(CPURolloutEngine pid=16197)\x1b[0m (EngineCore pid=16526) "  # vLLM's, inside Ray's
ACTOR = "\x1b[36m(CPURolloutEngine pid=16197)\x1b[0m "  # Ray's, in colour
POLICY = "\x1b[36m(PolicyModelActor pid=16264)\x1b[0m "

#: The shape of a real run where the engine core failed first (lines as Ray and vLLM print them).
LOG = [
    "[rpg-train] --backend cpu",
    "[cpu-backend] starting Ray with 2 logical GPU(s), 4 logical CPU(s)",
    f"{ENGINE}INFO 11-28 02:23:14 [cpu_model_runner.py:131] Starting to load model /tmp/m...",
    f"{ENGINE}init_process_group (gloo): 192.0.2.2:56419 rank=1 world_size=2",
    f"{POLICY}[WARNING] ZeRO stage 0: nothing to partition",
    f"{ENGINE}ERROR 11-28 02:23:19 [core.py:1373] EngineCore encountered a fatal error.",
    f"{ENGINE}Traceback (most recent call last):",
    f'{POLICY}Global step 0: {{"loss": 1.0}}',
    f'{ENGINE}  File "/v/vllm/v1/engine/core.py", line 1362, in run_engine_core',
    f"{ENGINE}    engine_core.run_busy_loop()",
    f"{ENGINE}RuntimeError: the engine's own cause",
    f"{ENGINE}",
    f"{ACTOR}WARNING 11-28 02:23:19 [core_client.py:729] [shutdown] MPClient: engine core exited unexpectedly",
    "Traceback (most recent call last):",
    '  File "/r/ray/_private/worker.py", line 2967, in get',
    "ray.exceptions.RayTaskError(EngineDeadError): ray::CPURolloutEngine.generate() (pid=16197)",
    *[f"{POLICY}later noise {i}" for i in range(80)],
    "rpg-train: error: a rollout engine's vLLM engine process (VLLM::EngineCore) died: EngineDeadError",
]


def test_the_engines_traceback_is_shown_whole_and_first() -> None:
    line, text = first_error("\n".join(LOG))
    assert line == 6  # the engine's ERROR line, not the driver's later RayTaskError
    # the logged error and its traceback through the exception line; the policy's line left out
    assert text.splitlines() == [row for row in LOG[5:11] if row.startswith(ENGINE)]
    message = explain("\n".join(LOG), "rpg-train")
    assert message.startswith(f"first error of rpg-train (log line 6 of {len(LOG)}):\n{LOG[5]}")
    assert "RuntimeError: the engine's own cause" in message
    assert message.endswith("\n".join(LOG[-TAIL_LINES:]))  # and the log's end, for what followed


def test_a_traceback_ends_after_its_exception_line_and_a_chained_one_continues() -> None:
    log = [
        "step 1",
        "Traceback (most recent call last):",
        '  File "a.py", line 1, in f',
        "KeyError: 'x'",
        "",
        "During handling of the above exception, another exception occurred:",
        "",
        "Traceback (most recent call last):",
        '  File "b.py", line 2, in g',
        "ValueError: from g",
        "",
        "after the traceback",
    ]
    line, text = first_error("\n".join(log))
    assert line == 2 and text.splitlines() == log[1:10]


def test_a_crash_without_a_python_traceback_is_found() -> None:
    log = [
        f"{ENGINE}init_process_group (gloo): 192.0.2.2:56419 rank=1 world_size=2",
        f"{ENGINE}terminate called after throwing an instance of 'gloo::IoException'",
        f"{ENGINE}  what():  [gloo/transport/tcp/pair.cc:538] Read error",
        f"{ACTOR}WARNING [core_client.py:729] [shutdown] MPClient: engine core exited unexpectedly",
    ]
    line, text = first_error("\n".join(log))
    assert line == 2 and text.splitlines() == log[1:3]


def test_a_segfault_caught_by_vllms_tvm_ffi_handler_is_the_first_error() -> None:
    """A SIGSEGV in the real engine core is printed by tvm_ffi's handler (vLLM imports it), not Python's."""
    log = [
        f"{ENGINE}init_process_group (gloo): 192.0.2.2:56419 rank=1 world_size=2",
        f"{ENGINE}!!!!!!! Segfault encountered !!!!!!!",
        f"{ACTOR}WARNING [core_client.py:729] [shutdown] MPClient: engine core exited unexpectedly",
        f"{ACTOR}ERROR [async_llm.py:480] AsyncLLM output_handler failed.",
    ]
    line, _ = first_error("\n".join(log))
    assert line == 2


def test_a_clean_log_has_no_error_and_known_harmless_lines_are_not_errors() -> None:
    log = [
        "[WARNING] Please --packing_samples to accelerate when --use_dynamic_batch is enabled.",
        f"{ENGINE}WARNING 11-28 [cpu_worker.py:127] libtcmalloc is not found in LD_PRELOAD.",
        "ERROR: ld.so: object '/work/ci run/.venv/lib/libgomp.so' from LD_PRELOAD cannot be preloaded: ignored.",
        "Global step 1: {'policy_loss': 0.1}",
    ]
    assert first_error("\n".join(log)) is None
    assert explain("\n".join(log)).startswith("no error line in the run's log (4 lines)")
