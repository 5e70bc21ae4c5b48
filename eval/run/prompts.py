"""Prompt styles.  The model's chat template is applied by lm-eval (apply_chat_template), except for
the ``plain`` style: the problem text verbatim as the whole model input (no instruction, no chat
template), for tiny models trained on raw text such as the CPU demo's ``"12+7="`` -> ``"19"``."""

from __future__ import annotations

PROMPT_STYLES = ("boxed", "dapo", "plain")
# The styles of the shipped task yamls (eval/run/tasks/); plain is for custom benchmarks only.
BUILTIN_STYLES = ("boxed", "dapo")


def uses_chat_template(style: str) -> bool:
    """Whether lm-eval wraps the prompt in the model's chat template (off for ``plain``)."""
    return style != "plain"


# Boxed chain of thought (Qwen2.5-Math / DeepSeek style); the default.
BOXED_TEMPLATE = "{problem}\nPlease reason step by step, and put your final answer within \\boxed{{}}."
# The DAPO prompt of the RPG paper's evaluation files, verbatim.
DAPO_TEMPLATE = (
    "Solve the following math problem step by step. The last line of your response should be of the "
    "form Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n{problem}\n\n"
    'Remember to put your answer on its own line after "Answer:".'
)


def render_prompt(problem: str, style: str = "boxed") -> str:
    """The user message for ``problem`` in ``style`` ("boxed", "dapo" or "plain": verbatim)."""
    if style == "boxed":
        return BOXED_TEMPLATE.format(problem=problem)
    if style == "dapo":
        return DAPO_TEMPLATE.format(problem=problem)
    if style == "plain":
        return problem
    raise ValueError(f"prompt style must be one of {PROMPT_STYLES}, got {style!r}")
