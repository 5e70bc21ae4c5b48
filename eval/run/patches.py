"""The eval package's seam entries (lm-eval), declared beside it, and the versions it was checked
against (``rpg-eval`` checks them before anything runs). Plain data."""

from rpg_openrlhf.common.seam import Patch

#: rpg-eval: distribution -> versions checked (public version: "0.29.0+cpu" counts as "0.29.0").
CHECKED_VERSIONS: dict[str, tuple[str, ...]] = {"lm_eval": ("0.4.13",), "vllm": ("0.29.0",)}

PATCHES: tuple[Patch, ...] = (
    Patch(
        key="lm_eval_env_info",
        kind="scoped",
        package="lm_eval",
        target="lm_eval.evaluator.add_env_info / get_git_commit_hash",
        replacement="no-ops (rpg_eval.run.runner._no_lm_eval_env_info)",
        why="~0.3 s of collect_env and git per call (23% of generation time, bench/eval_overhead.py), for results never read",
        why_no_extension_point="simple_evaluate always calls them",
        upstream="lm_eval.evaluator:simple_evaluate",
        anchors=('results["git_hash"] = get_git_commit_hash()', "add_env_info(results)"),
        fingerprint="185bc59baf3ba97a",
    ),
    Patch(
        key="lm_eval_repeats",
        kind="private",
        package="lm_eval",
        target="lm-eval's repeated Instance objects (grouped by id())",
        why="rpg_eval.run.lm_models groups a problem's k samples by identity to seed them per problem",
        why_no_extension_point="lm-eval passes no sample index to generate_until",
        upstream="lm_eval.evaluator:evaluate",
        anchors=("cloned_reqs.extend([req] * req.repeats)",),
        fingerprint="6d685a5bd2c0dbab",
    ),
)
