"""Helix: serve one LLM across mixed GPUs in several regions.

The package root is the vocabulary (spec, units, hardware and model catalogs, cost model, plan
types, errors); ``helix.net`` is the protocol, ``helix.sim`` the simulator, and ``helix.server``,
``helix.commands``, ``helix.cli`` and ``helix.client`` the front doors.
"""


def __getattr__(name: str):
    # ``helix.Client`` without importing grpc on ``import helix`` (the CLI stays fast).
    if name == "Client":
        from helix.client import Client
        return Client
    raise AttributeError(f"module 'helix' has no attribute {name!r}")
