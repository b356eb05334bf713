"""helix."""


def __getattr__(name: str):
    # ``helix.Client`` without importing grpc on ``import helix`` (the CLI stays fast).
    if name == "Client":
        from helix.client import Client
        return Client
    raise AttributeError(f"module 'helix' has no attribute {name!r}")
