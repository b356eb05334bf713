"""``helix keys DIR``: make a cluster's keys (ZeroMQ CURVE, a TLS certificate, a bearer token)."""

from __future__ import annotations

from pathlib import Path

import typer


def keys(folder: Path = typer.Argument(..., help="folder to write the keys to (made with mode 0700)"),
         force: bool = typer.Option(False, "--force", help="replace keys already in FOLDER")) -> None:
    """Make the keys that encrypt and authenticate a cluster's data and control planes."""
    from helix.net.keys import TLS_SERVER_NAME, generate
    written = generate(folder, force=force)
    for path in written:
        typer.echo(f"wrote {path} (mode 0600)")
    typer.echo(
        f"\nThe data plane's CURVE keys, a self-signed TLS certificate for {TLS_SERVER_NAME!r} with "
        f"its key, and a bearer token. Keep {folder} private: whoever holds it is a cluster member.\n"
        f"  helix serve plan.yaml --model M --keys {folder} ...   Ray workers get the keys from here\n"
        f"  helix worker --keys {folder} ...                      copy the folder to each such machine\n"
        f"  helix.Client(addr, tls_cert='{folder}/grpc.crt')       the native client trusts the certificate")


def register(app: typer.Typer) -> None:
    app.command("keys")(keys)
