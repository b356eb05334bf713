"""``helix nodes`` and ``helix replan``: a running server's nodes, and applying a new plan to it live
over its admin HTTP routes (:mod:`helix.server.admin`)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from helix.commands.drain import _KEY_HELP, _SERVER_HELP, AdminClient, _line
from helix.core.errors import HelixUserError
from helix.core.slices import LayerSlice, as_placement


def nodes(server: str = typer.Option("http://127.0.0.1:8000", "--server", help=_SERVER_HELP),
          api_key: Optional[str] = typer.Option(None, "--api-key", envvar="HELIX_API_KEY",
                                                help=_KEY_HELP)) -> None:
    """Every node of the running plan: its layers, state (ok / suspect / dead / draining / drained)
    and the requests on it; then nodes that registered to join and are not serving yet (planning,
    applying, idle when the re-plan kept the running placement, failed), with why."""
    client = AdminClient(server, api_key)
    try:
        for status in client.call("GET", "/admin/nodes")["nodes"]:
            typer.echo(_line(status))
        try:
            joins = client.call("GET", "/admin/joins")["joins"]
        except HelixUserError:   # a server without joins (not helix serve)
            joins = []
        for j in joins:
            if j["state"] != "serving":
                typer.echo(f"{j['node']}: joining, {j['state']}" + (f": {j['detail']}" if j["detail"] else ""))
    finally:
        client.close()


def _rng(r) -> str:
    return "-" if r is None else f"[{r[0]}, {r[1]})"


def _moves(running: dict, new: dict) -> list[str]:
    def ranges(plan):
        return as_placement((LayerSlice(**p) for p in plan["placements"]), skip_empty=True)
    now, then = ranges(running), ranges(new)
    lines = []
    for node in sorted(set(now) | set(then)):
        a, b = now.get(node), then.get(node)
        if a != b:
            lines.append(f"  {node}: {_rng(a)} -> {_rng(b)}")
    return lines


def replan(plan: Path = typer.Argument(..., help="the new plan.yaml (e.g. from `helix plan CLUSTER "
                                                 "--from running.yaml -o new.yaml`)"),
           server: str = typer.Option("http://127.0.0.1:8000", "--server", help=_SERVER_HELP),
           api_key: Optional[str] = typer.Option(None, "--api-key", envvar="HELIX_API_KEY",
                                                 help=_KEY_HELP),
           apply: bool = typer.Option(False, "--apply", help="apply it: each node whose layers "
                                      "change drains, lets its requests finish, loads its new "
                                      "slice and takes requests again; then routing switches to "
                                      "the new plan. Without --apply: only list the changes"),
           save_running: Optional[Path] = typer.Option(None, "--save-running", help="first write "
                                                       "the running plan here (for `helix plan "
                                                       "--from`)"),
           timeout: float = typer.Option(600.0, "--timeout", min=1.0, help="with --apply: longest "
                                         "wait for one node's requests to finish")) -> None:
    """Compare PLAN with the server's running plan, and with --apply switch the server to it
    without dropping requests. Nodes PLAN places must all be serving (a new node joins with
    `helix worker --gpu` instead); a node PLAN drops leaves routing at the switch and is let go
    once its requests are done (its worker stays up, idle)."""
    from helix.core.plan import Plan
    if not plan.is_file():
        raise HelixUserError(f"no such plan file {str(plan)!r}")
    new = Plan.load(plan).to_dict()
    client = AdminClient(server, api_key, timeout_s=timeout + 60)
    try:
        running = client.call("GET", "/admin/plan")
        if save_running is not None:
            Plan.from_dict(running, "the running plan").save(save_running)
            typer.echo(f"wrote the running plan to {save_running}")
        moves = _moves(running, new)
        typer.echo(f"{len(moves)} node(s) change their layers" + (":" if moves else ""))
        for line in moves:
            typer.echo(line)
        if not apply:
            if moves:
                typer.echo("dry run: pass --apply to switch the server to it (see `helix plan "
                           "CLUSTER --from running.yaml` for its predicted gain and cost)")
            return
        report = client.call("POST", "/admin/plan", {"plan": new, "timeout_s": timeout})
        for s in report["steps"]:
            old = "joined with" if s["old"] is None else f"{_rng(s['old'])} ->"
            typer.echo(f"  {s['node']}: {old} {_rng(s['new'])}: drained in {s['drain_s']:.1f} s, "
                       f"loaded in {s['load_s']:.1f} s" + (" (no pipeline meanwhile: requests "
                                                           "waited)" if s["forced"] else ""))
        typer.echo(f"applied in {report['seconds']:.1f} s; routing on the new plan "
                   f"({report['max_flow_tokens_per_s']:,.0f} tokens/s max flow)")
    finally:
        client.close()


def register(app: typer.Typer) -> None:
    app.command("nodes")(nodes)
    app.command("replan")(replan)
