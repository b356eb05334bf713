"""Helix: serve one LLM across mixed GPUs in several regions.

The package's floors (README "Layout"; ``tests/test_layering.py`` keeps imports going down):
``helix.core`` the vocabulary (spec, units, catalogs, cost model, plan types, errors),
``helix.net`` the protocol, ``helix.sim`` the simulator, ``helix.server`` the serving stack, and
``helix.commands``, ``helix.cli``, ``helix.client`` and ``helix.loadgen`` the front doors.
"""


def __getattr__(name: str):
    # ``helix.Client`` without importing grpc on ``import helix`` (the CLI stays fast).
    if name == "Client":
        from helix.client import Client
        return Client
    raise AttributeError(f"module 'helix' has no attribute {name!r}")
