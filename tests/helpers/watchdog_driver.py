"""A driver for tests/test_watchdog.py: a local Ray, the watchdog, and the main thread waiting in ``ray.get``
on an actor that never answers (a peer stuck in a collective) while another actor is killed.

``python watchdog_driver.py kill|ray_kill``: ``kill`` SIGKILLs the idle ``PolicyModelActor`` (the run must
end with one line, exit 1); ``ray_kill`` ends it with ``ray.kill`` (intended: the run goes on; the stuck
call is then released and the driver exits 0). Prints ``killed <time>`` when it killed.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import ray

from rpg_openrlhf.cpu_backend.driver import RAY_NODE_DEFAULTS
from rpg_openrlhf.extras import watchdog


@ray.remote(num_cpus=0)
class PolicyModelActor:
    def pid(self) -> int:
        return os.getpid()


@ray.remote(num_cpus=0)
class Peer:
    def wait(self, seconds: float) -> str:
        time.sleep(seconds)
        return "done"


def main(mode: str) -> None:
    # workers un-niced: at Ray's niceness 15 a loaded machine starves them
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        _system_config=RAY_NODE_DEFAULTS,
    )
    watchdog.start(interval=0.5, last_checkpoint=lambda: "/ckpt/_actor/global_step2", prog="prog", grace=5)
    victim, peer = PolicyModelActor.remote(), Peer.remote()
    pid = ray.get(victim.pid.remote())

    def kill() -> None:
        time.sleep(2)
        ray.kill(victim) if mode == "ray_kill" else os.kill(pid, signal.SIGKILL)
        print(f"killed {time.time()}", flush=True)

    threading.Thread(target=kill, daemon=True).start()
    with watchdog.reporting("prog"):
        print(ray.get(peer.wait.remote(8 if mode == "ray_kill" else 600)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
