"""Rendezvous ports from outside the kernel's ephemeral range (rpg_openrlhf/cpu_backend/ports.py).

The hazard: OpenRLHF binds port 0, closes, and its rendezvous binds the port later; port 0 and every
outgoing connection are served from ``ip_local_port_range``, so another process can be handed that
port in between (EADDRINUSE; seen once in the suite, docs/testing.md). The patched picks
(seams ``launcher_port`` / ``sync_group_port``, checked on OpenRLHF's own code in
tests/test_cpu_backend.py) never come from that range.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from rpg_openrlhf.cpu_backend import ports


def _kernel_range() -> tuple[int, int]:
    low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
    return int(low), int(high)


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


def test_kernel_picks_are_ephemeral_and_ours_never_are() -> None:
    low, high = _kernel_range()
    if not ports.outside_ephemeral(low, high):
        pytest.skip(f"this machine's ephemeral range {low}-{high} leaves no stretch outside it")
    kernel, ours = set(), set()
    for _ in range(100):
        with socket.socket() as sock:  # OpenRLHF's pick, as written upstream
            sock.bind(("", 0))
            kernel.add(sock.getsockname()[1])
        port = ports.rendezvous_port()
        ours.add(port)
        with socket.socket() as sock:  # free when handed out
            sock.bind(("", port))
    assert all(low <= p <= high for p in kernel)  # the hazard: the range other processes draw from
    assert not any(low <= p <= high for p in ours) and min(ours) >= 20000 and max(ours) < 65536
    assert len(ours) > 90  # spread at random (two runs on one machine rarely pick the same)


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


def test_socket_binds_port_zero_outside_and_other_ports_as_asked() -> None:
    low, high = _kernel_range()
    if not ports.outside_ephemeral(low, high):
        pytest.skip(f"this machine's ephemeral range {low}-{high} leaves no stretch outside it")
    with ports.RendezvousSocket() as sock:
        sock.bind(("127.0.0.1", 0))
        assert not low <= sock.getsockname()[1] <= high
    with socket.socket() as probe:
        probe.bind(("", 0))
        wanted = probe.getsockname()[1]
    with ports.RendezvousSocket() as sock:
        sock.bind(("127.0.0.1", wanted))
        assert sock.getsockname()[1] == wanted
