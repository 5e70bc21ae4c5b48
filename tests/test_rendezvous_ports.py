"""Rendezvous ports from outside the kernel's ephemeral range (rpg_openrlhf/cpu_backend/ports.py).

The hazard: OpenRLHF binds port 0, closes, and its rendezvous binds the port later; port 0 and every
outgoing connection are served from ``ip_local_port_range``, so another process can be handed that
port in between (EADDRINUSE; seen once in the suite, docs/testing.md). The patched picks
(seams ``launcher_port`` / ``sync_group_port``) never come from that range: checked on OpenRLHF's
own code in tests/test_cpu_backend.py.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from rpg_openrlhf.cpu_backend import ports


def test_ephemeral_range_is_read_and_defaults_to_linux(tmp_path: Path) -> None:
    path = tmp_path / "ip_local_port_range"
    path.write_text("40000\t50000\n")
    assert ports.ephemeral_range(path) == (40000, 50000)
    assert ports.ephemeral_range(tmp_path / "absent") == (32768, 60999)
    path.write_text("garbage\n")
    assert ports.ephemeral_range(path) == (32768, 60999)


def test_stretches_leave_out_the_ephemeral_range_and_rays_worker_ports() -> None:
    assert ports.outside_ephemeral(32768, 60999) == [range(20000, 32768), range(61000, 65536)]
    assert ports.outside_ephemeral(1024, 65535) == []  # all ephemeral: the kernel's choice is the fallback
    assert ports.outside_ephemeral(20500, 64999) == []  # stretches under 1,000 ports are not used
    assert ports.outside_ephemeral(10000, 60999) == [range(61000, 65536)]


def test_taken_ports_are_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        picks = iter([busy, busy, 20001])
        monkeypatch.setattr(ports, "outside_ephemeral", lambda low, high: [range(busy, busy + 1)])

        class Pick:
            def choice(self, seq):  # noqa: ANN001, ANN201
                return seq[0]

            def randrange(self, start: int, stop: int) -> int:
                return next(picks)

        monkeypatch.setattr(ports.random, "SystemRandom", Pick)
        assert ports.rendezvous_port() == 20001


def test_socket_binds_other_ports_as_asked() -> None:
    """Port 0 lands outside the range (checked on OpenRLHF's own lines in tests/test_cpu_backend.py)."""
    with socket.socket() as probe:
        probe.bind(("", 0))
        wanted = probe.getsockname()[1]
    with ports.RendezvousSocket() as sock:
        sock.bind(("127.0.0.1", wanted))
        assert sock.getsockname()[1] == wanted
