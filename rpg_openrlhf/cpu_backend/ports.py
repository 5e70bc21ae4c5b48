"""Rendezvous ports that no other process on the machine is handed in the meantime.

OpenRLHF picks each rendezvous port (DeepSpeed's ``MASTER_PORT``, the vLLM weight-sync group) by binding
port 0 and closing the socket; the rendezvous binds it later. Port 0 and outgoing connections draw from
the kernel's ephemeral range, so meanwhile another process (Ray's gRPC, a second pipeline) can get the
same port: EADDRINUSE (seen once in the suite, docs/testing.md). A port picked at random outside that
range is never handed out by the kernel. Plain standard library: it runs in every Ray worker.
"""

from __future__ import annotations

import random
import socket as _socket
from pathlib import Path
from types import ModuleType, SimpleNamespace

#: Where Linux keeps the ephemeral range ("32768\t60999" by default).
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
#: Below this: Ray's worker ports (10002-19999 by default) and the well-known ones.
LOWEST = 20000
#: A stretch of fewer ports than this is not used (collisions between picks get likely).
MIN_STRETCH = 1000
ATTEMPTS = 64


def ephemeral_range(path: Path = EPHEMERAL_RANGE_FILE) -> tuple[int, int]:
    """The kernel's ephemeral port range, inclusive; Linux's default where it cannot be read."""
    try:
        low, high = (int(field) for field in path.read_text().split())
    except (OSError, ValueError):
        return 32768, 60999
    return low, high


def outside_ephemeral(low: int, high: int) -> list[range]:
    """The stretches of ports from :data:`LOWEST` up that the kernel never hands out itself."""
    stretches = [range(LOWEST, low), range(high + 1, 65536)]
    return [stretch for stretch in stretches if len(stretch) >= MIN_STRETCH]


def bind_outside_ephemeral(sock: _socket.socket, host: str = "") -> int:
    """Bind ``sock`` to a free port outside the ephemeral range, at random; return the port.

    Falls back to the kernel's choice (port 0) if the range leaves no stretch or every try is taken.
    """
    stretches = outside_ephemeral(*ephemeral_range())
    pick = random.SystemRandom()
    for _ in range(ATTEMPTS if stretches else 0):
        stretch = pick.choice(stretches)
        port = pick.randrange(stretch.start, stretch.stop)
        try:
            _socket.socket.bind(sock, (host, port))
        except OSError:
            continue  # in use (or in TIME_WAIT): another try; a failed bind leaves the socket unbound
        return port
    _socket.socket.bind(sock, (host, 0))
    return sock.getsockname()[1]


def rendezvous_port(host: str = "") -> int:
    """A free TCP port outside the ephemeral range (bound once to check, then released)."""
    with _socket.socket() as sock:
        return bind_outside_ephemeral(sock, host)


class RendezvousSocket(_socket.socket):
    """``socket.socket`` whose bind to port 0 takes a port outside the ephemeral range instead."""

    def bind(self, address: object) -> None:
        if isinstance(address, tuple) and len(address) == 2 and address[1] == 0:
            bind_outside_ephemeral(self, str(address[0]))
        else:
            super().bind(address)


def use_rendezvous_ports(module: ModuleType) -> None:
    """seam ``launcher_port`` / ``sync_group_port``: the module's ``socket`` name (used there only to
    pick a rendezvous port) becomes a namespace whose ``socket`` is :class:`RendezvousSocket`."""
    module.socket = SimpleNamespace(socket=RendezvousSocket)  # type: ignore[attr-defined]
