"""``helix validate`` and ``helix convert``: read a cluster, check it, say what it can do."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from helix.core.errors import SpecError
from helix.core.spec import ClusterSpec, load_cluster, parse_cluster
from helix.core.units import format_bandwidth, format_duration, format_size

_SPARK = "▁▂▃▄▅▆▇█"


def load_any(path: Path, helix_ini: Optional[list[Path]], model: Optional[str]) -> ClusterSpec:
    """A YAML spec, or a reference-format cluster.ini + machine_profile.ini pair."""
    if helix_ini:
        from helix.core.helix_ini import read_helix_ini
        if len(helix_ini) != 1:
            raise SpecError("--from-helix-ini takes the machine_profile.ini; the cluster .ini is "
                            "the positional argument")
        return read_helix_ini(path, helix_ini[0], model=model or "llama-2-70b")
    spec = load_cluster(path)
    if model is not None:
        data = spec.to_dict()
        data["model"] = model
        spec = parse_cluster(data, source=str(path), base_dir=path.parent)
    return spec


def sparkline(values: tuple[float, ...]) -> str:
    if not values:
        return ""
    hi = max(values) or 1.0
    return "".join(_SPARK[min(len(_SPARK) - 1, int(v / hi * (len(_SPARK) - 1) + 0.5))] for v in values)


def _check_fits(spec: ClusterSpec, capacity: dict[str, int], source: Path) -> None:
    model = spec.model
    if not any(capacity.values()):
        need = format_size(model.layer_bytes(spec.dtype_bytes))
        usable = max(n.vram_bytes for n in spec.nodes) * spec.serving.gpu_memory_utilization
        raise SpecError(f"{source}: model {model.name}: no node can hold even one layer ({need} of "
                        f"weights per layer plus a KV reserve); the largest node has "
                        f"{format_size(usable)} usable")
    total = sum(capacity.values())
    if total < model.num_layers:
        weights = model.num_layers * model.layer_bytes(spec.dtype_bytes)
        usable = sum(n.vram_bytes for n in spec.nodes) * spec.serving.gpu_memory_utilization
        raise SpecError(f"{source}: model {model.name}: the cluster holds at most {total} of its "
                        f"{model.num_layers} layers (needs {format_size(weights)} of weights plus "
                        f"KV reserve, cluster has {format_size(usable)} usable)")


def cut_off_nodes(spec: ClusterSpec) -> set[str]:
    """Nodes with no network path from the coordinator or none back to it (a region left
    unconnected; with directed links the two can differ)."""
    from helix.core.plan import COORDINATOR
    names = [n.name for n in spec.nodes]

    def reached(step) -> set[str]:
        seen, todo = {COORDINATOR}, [COORDINATOR]
        while todo:
            here = todo.pop()
            for other in names:
                if other not in seen and step(here, other) is not None:
                    seen.add(other)
                    todo.append(other)
        return seen

    return set(names) - (reached(spec.link) & reached(lambda a, b: spec.link(b, a)))


def summary_table(spec: ClusterSpec) -> tuple[Table, dict[str, int]]:
    from helix.core.costmodel import CostModel
    cost = CostModel.for_cluster(spec)
    groups: dict[tuple[str, str], list] = defaultdict(list)
    for node in spec.nodes:
        groups[(spec.region_of(node.name), node.label)].append(node)
    table = Table(title=f"{spec.model.name} on {len(spec.nodes)} nodes")
    for col in ("region", "kind", "nodes", "memory/node", "max k mid/first/last",
                "T(1) tok/s", "T(kmax) tok/s", "T(k) k=1..kmax"):
        table.add_column(col, justify="right" if col.startswith(("nodes", "T(", "max")) else "left")
    capacity: dict[str, int] = {}
    for (region, label), nodes in sorted(groups.items()):
        node = nodes[0]
        mid, first, last = (cost.max_layers(node), cost.max_layers(node, first=True),
                            cost.max_layers(node, last=True))
        curve = cost.throughput_table(node)
        for n in nodes:
            capacity[n.name] = max(mid, first, last)
        table.add_row(region, label, str(len(nodes)), format_size(node.vram_bytes),
                      f"{mid}/{first}/{last}", f"{curve[0]:,.0f}" if curve else "-",
                      f"{curve[-1]:,.0f}" if curve else "-", sparkline(curve))
    return table, capacity


def network_lines(spec: ClusterSpec, regions: bool = True) -> list[str]:
    """The network in a few lines: each region's figures (unless ``regions`` is False), between
    regions, the coordinator's links, the per-link overrides."""
    lines = [f"region {name}: {_fmt(link)}" for name, link in spec.regions.items()] if regions \
        else []
    if spec.inter_region is not None:
        lines.append(f"between regions: {_fmt(spec.inter_region)}"
                     + "".join(f"; {' <-> '.join(rl.regions)} {_fmt(rl)}" for rl in spec.region_links))
    elif len(spec.regions) > 1 and not spec.region_links:
        lines.append("between regions: not connected (no inter_region given)")
    c = spec.coordinator
    lines.append(f"coordinator in region {spec.coordinator_region}"
                 + (f"; outbound {_fmt(c.outbound)}" if c.outbound else "")
                 + (f"; inbound {_fmt(c.inbound)}" if c.inbound else ""))
    if spec.links or spec.only_listed_links:
        lines.append(f"{len(spec.links)} per-link override(s)"
                     + (" (only these pairs are connected)" if spec.only_listed_links else
                        " (links that differ from the figures above)"))
    return lines


def _fmt(link) -> str:
    return f"{format_bandwidth(link.bandwidth_bytes_per_s)}, {format_duration(link.latency_s)}"


def validate(
    cluster: Path = typer.Argument(..., help="Cluster spec YAML (or a reference .ini with "
                                   "--from-helix-ini)."),
    from_helix_ini: Optional[list[Path]] = typer.Option(
        None, "--from-helix-ini", help="Read CLUSTER as the reference Helix INI format; this "
        "option names its machine_profile.ini."),
    model: Optional[str] = typer.Option(None, "--model", help="Override the spec's model: a "
                                        "catalog name, a checkpoint folder or a GGUF file."),
) -> None:
    """Check a cluster spec and print what each node can hold and how fast it runs.

    Prints nodes per region and GPU kind, memory, the most layers each can hold (as a middle,
    first or last stage) and its throughput curve T(k); exits non-zero with one line on bad input.
    """
    spec = load_any(cluster, from_helix_ini, model)
    console = Console() if Console().is_terminal else Console(width=130)
    table, capacity = summary_table(spec)
    unreachable = cut_off_nodes(spec)
    _check_fits(spec, {n: k for n, k in capacity.items() if n not in unreachable}, cluster)
    m = spec.model
    weights = format_size(m.num_layers * m.layer_bytes(spec.dtype_bytes)
                          + m.embedding_bytes(spec.dtype_bytes) + m.lm_head_bytes(spec.dtype_bytes))
    console.print(f"[bold]{cluster}[/bold]: valid (spec hash {spec.content_hash()})")
    console.print(f"model {m.name}: {m.num_layers} layers, hidden {m.hidden_size}, "
                  f"{m.num_heads} heads / {m.num_kv_heads} KV heads, {weights} of {spec.dtype} "
                  f"weights; workload prompt {spec.workload.mean_prompt_tokens:g} / output "
                  f"{spec.workload.mean_output_tokens:g} tokens")
    console.print(table)
    for line in network_lines(spec):
        console.print(f"  {line}")
    if unreachable:
        console.print(f"[yellow]warning[/yellow]: {len(unreachable)} node(s) have no network path "
                      f"to the coordinator and cannot serve: {', '.join(sorted(unreachable))}")
    console.print(f"layer capacity: {sum(capacity.values())} layer slots for "
                  f"{m.num_layers} layers")


def convert(
    cluster_ini: Path = typer.Argument(..., help="Reference Helix cluster .ini"),
    machine_profile_ini: Path = typer.Argument(..., help="Its machine_profile.ini"),
    output: Path = typer.Option(..., "-o", "--output", help="Where to write the YAML spec."),
    model: str = typer.Option("llama-2-70b", "--model", help="Model the cluster will serve "
                              "(the INI format does not name one)."),
    regions: Optional[Path] = typer.Option(None, "--regions", help="YAML: region name -> list of "
                                           "node names (node-0, ...), instead of inferring them."),
    tolerance: float = typer.Option(0.0, "--link-tolerance", help="Links within this relative "
                                    "difference of their region's figure take that figure instead "
                                    "of an override (0 keeps every link exact)."),
    tables: Optional[Path] = typer.Option(None, "--throughput-tables", help="YAML of T(k) tables "
                                          "(label: [tokens/s at k = 1, 2, ...]) to embed."),
    tables_case: Optional[str] = typer.Option(None, "--tables-case", help="Which case of a "
                                              "multi-case tables file (default: the INI's stem)."),
) -> None:
    """Convert a reference Helix INI cluster into a Helix cluster YAML.

    Regions are inferred from the link table (components over the links above its widest
    bandwidth gap) and printed one per line; links are written as region, inter-region and
    coordinator figures plus per-pair overrides where a link differs from them.
    """
    from helix.core.helix_ini import convert_ini, load_throughput_tables, spec_yaml
    from helix.core.yamlio import read_yaml
    given = read_yaml(regions, "regions") if regions is not None else None
    table = load_throughput_tables(tables, tables_case or cluster_ini.stem) \
        if tables is not None else None
    result = convert_ini(cluster_ini, machine_profile_ini, model=model, regions=given,
                         regions_source=str(regions), tolerance=tolerance, throughput_tables=table)
    spec = result.spec
    output.write_text(spec_yaml(spec))
    typer.echo(f"regions: {result.regions.how}")
    for name, members in result.regions.members.items():
        kinds = ", ".join(f"{n} {k}" for k, n in _count(spec.node(m).label for m in members))
        fig = spec.regions[name]
        typer.echo(f"  {name}: {', '.join(members)}  ({kinds}; {_fmt(fig)} inside)")
    for line in network_lines(spec, regions=False):
        typer.echo(line)
    if spec.links and tolerance == 0 and not spec.only_listed_links:
        looser = convert_ini(cluster_ini, machine_profile_ini, model=model, regions=given,
                             regions_source=str(regions), tolerance=0.1).spec
        typer.echo(f"  (--link-tolerance 0.1 would keep {len(looser.links)} overrides)")
    if result.tables_for:
        typer.echo(f"throughput tables for {', '.join(result.tables_for)}")
    typer.echo(f"wrote {output} ({len(spec.nodes)} nodes, {len(spec.regions)} region(s), "
               f"{len(spec.links)} link overrides)")


def _count(labels) -> list[tuple[str, int]]:
    counts: dict[str, int] = {}
    for label in labels:
        counts[label] = counts.get(label, 0) + 1
    return list(counts.items())


def register(app: typer.Typer) -> None:
    app.command("validate")(validate)
    app.command("convert")(convert)
