"""The address a server bound to every interface tells its peers (``advertised_host``): never a
loopback address from the host name when this machine has another (workers and the
coordinator on other machines dial it)."""

from __future__ import annotations

import socket

import pytest

from helix.net.data_plane import DataPlane, advertised_host


def _outward_address() -> str | None:
    """This machine's address on its route out, by Ray's own rule (None: there is none)."""
    ray = pytest.importorskip("ray")
    address = ray.util.get_node_ip_address()
    return None if address.startswith("127.") else address


def test_every_interface_is_advertised_as_the_outward_address():
    outward = _outward_address()
    if outward is None:
        pytest.skip("this machine has no address besides loopback")
    named = socket.gethostbyname(socket.gethostname())
    assert advertised_host("0.0.0.0") == (named if not named.startswith("127.") else outward)
    plane = DataPlane("0.0.0.0")
    try:
        assert not plane.address.startswith("tcp://127."), plane.address
    finally:
        plane.close()


def test_a_bound_address_is_advertised_as_is():
    assert advertised_host("127.0.0.2") == "127.0.0.2"
    assert advertised_host("10.1.2.3") == "10.1.2.3"
