"""``python -m rpg_openrlhf.nodecheck`` (``make gpu-check``): what a user runs first on a new GPU node.

In a few minutes, on a tiny model and 1-2 GPUs, it checks that the pipeline is right there and prints one
line per check (PASS/FAIL and what it measured), then writes ``report.json`` in ``--out``:

* ``environment``: a CUDA torch, the GPUs asked for, flash-attn's CUDA extension, vLLM, DeepSpeed, NCCL;
* ``flash-attention``: flash-attn's causal attention against an fp32 reference at the check's length;
* ``pipeline``: ``rpg-train --backend gpu`` (RPG-RKL, bf16, flash-attention, colocated actor and vLLM
  engines with DeepSpeed and vLLM sleep, NCCL or CUDA-IPC weight sync) runs its steps;
* ``engine-vs-actor``: after every weight sync the engines' bf16 log-probs of fixed sequences (one of
  ``--seq-len`` tokens) beside a bf16 flash-attention forward of the actor's weights, the gap by token
  position (``rpg_openrlhf.common.sync_check``), and how far the actor moved between syncs;
* ``deepspeed-sleep`` / ``vllm-sleep``: states offloaded after each step and reloaded before each
  training micro-batch; vLLM's "Sleep mode freed" lines;
* ``step-time`` and ``peak-memory`` (NVML, every GPU, sampled while the run lasts).

``--report DIR`` prints the lines of an earlier check's directory again without running anything.
The thresholds of the bf16 gaps have not been measured on a GPU yet (none was available to this project):
the lines print the measured values so that a first run can set them.
"""
