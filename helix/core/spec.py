"""Cluster spec: the YAML a user writes to describe GPUs, regions, links, model and workload.

Validated once with pydantic, then frozen (STYLE.md rule 5). Quantities carry units in the YAML
(``10Gbps``, ``50ms``, ``40GiB``) and are stored in SI units (bytes/s, seconds, bytes); dumping
writes them back with explicit units, so a spec round-trips. Errors name the field path and the bad
value: ``nodes[3].gpu: unknown GPU 'A10O'; known: A100-40G, ...``.

Example (see ``cluster_specs/`` for complete ones)::

    model: llama-2-70b                 # catalog name, or a checkpoint folder / config.json / GGUF path
    coordinator: {region: us-east}
    workload: {mean_prompt_tokens: 763, mean_output_tokens: 232}
    regions:
      us-east: {bandwidth: 10Gbps, latency: 1ms}
      eu-west: {bandwidth: 10Gbps, latency: 1ms}
    inter_region: {bandwidth: 100Mbps, latency: 50ms}   # omit to leave regions unconnected
    nodes:
      - {name: "a100-{i}", gpu: A100-40G, count: 4, region: us-east}
      - {name: l4x2-0, gpu: L4, gpus: 2, region: eu-west, nic_bandwidth: 25Gbps}
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Annotated, Any, Callable

import yaml
from pydantic import (BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer,
                      PrivateAttr, ValidationError, ValidationInfo, field_validator, model_validator)

from helix.core.errors import SpecError
from helix.core.hardware import GPU_CATALOG, GpuKind, known_gpu_names, lookup_gpu
from helix.core.models import DTYPE_BYTES, ModelSpec, known_dtype, resolve_model
from helix.core.plan import COORDINATOR
from helix.core.profiles import MeasuredProfile, load_profile
from helix.core.serving import DEFAULT_STEP_TOKENS, ServingSpec, resolve_step_budget, sets_step_budget
from helix.core.spec_errors import expand_node_groups, first_error, point_at_entries
from helix.core.yamlio import read_yaml
from helix.core.units import UnitError, parse_bandwidth, parse_duration, parse_size


def _unit_parser(parse: Callable[[Any], float]) -> Callable[[Any], float]:
    def run(value: Any) -> float:
        try:
            return parse(value)
        except UnitError as exc:
            raise ValueError(str(exc)) from None
    return run


def _positive(kind: str) -> Callable[[float], float]:
    def check(value: float) -> float:
        if not value > 0:
            raise ValueError(f"{kind} must be positive, got {value:g}")
        return value
    return check


def _non_negative(value: float) -> float:
    if value < 0:
        raise ValueError(f"latency must not be negative, got {value:g}")
    return value


Bandwidth = Annotated[float, BeforeValidator(_unit_parser(parse_bandwidth)),
                      Field(gt=0), PlainSerializer(lambda v: f"{v!r}B/s", return_type=str)]
"""Bytes/s, written in the YAML with a unit (``10Gbps``, ``1.25GB/s``)."""
Duration = Annotated[float, BeforeValidator(_unit_parser(parse_duration)),
                     Field(ge=0), PlainSerializer(lambda v: f"{v!r}s", return_type=str)]
"""Seconds, written with a unit (``50ms``)."""
Size = Annotated[float, BeforeValidator(_unit_parser(parse_size)),
                 Field(gt=0), PlainSerializer(lambda v: f"{v!r}B", return_type=str)]
"""Bytes, written with a unit (``40GiB``)."""


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class LinkParams(_Frozen):
    """Bandwidth and latency of a network path."""

    bandwidth_bytes_per_s: Bandwidth = Field(alias="bandwidth")
    latency_s: Duration = Field(0.0, alias="latency")


class RegionLink(LinkParams):
    """Override of the inter-region default for one pair of regions (both directions)."""

    regions: tuple[str, str]


class NodeLink(LinkParams):
    """Override for a pair of vertices (node names or ``coordinator``): ``between: [a, b]`` sets
    both directions; ``from: a`` with ``to: b`` sets a -> b only and wins over a ``between`` entry
    (the reference INI's source and sink links differ: prompts out, sampled tokens back)."""

    between: tuple[str, str] | None = None
    src: str | None = Field(None, alias="from")
    dst: str | None = Field(None, alias="to")

    @model_validator(mode="after")
    def _one_form(self) -> "NodeLink":
        directed = self.src is not None or self.dst is not None
        if directed == (self.between is not None):
            raise ValueError("give either 'between: [a, b]' (both directions) or 'from' and 'to' "
                             "(one direction)")
        if directed and (self.src is None or self.dst is None):
            raise ValueError("a directed link needs both 'from' and 'to'")
        ends = self.ends
        if ends[0] == ends[1]:
            raise ValueError(f"a link joins two different vertices, got {ends[0]!r} twice")
        return self

    @property
    def ends(self) -> tuple[str, str]:
        return self.between if self.between is not None else (self.src, self.dst)  # type: ignore


class NodeSpec(_Frozen):
    """One compute node: one or more GPUs of a kind in one machine (tensor parallel inside)."""

    name: str = Field(min_length=1)
    gpu: str
    """GPU kind: a catalog name or alias (``A100-40G``, ``L4``, ``T4``, ``CPU`` ...)."""
    num_gpus: int = Field(1, ge=1, le=64, alias="gpus")
    """GPUs in this machine; the node's slice is split across them with tensor parallelism."""
    region: str | None = None
    """Region name; may be omitted when the spec declares exactly one region."""
    address: str | None = None
    """Host or IP where the worker runs (for `helix serve` on real machines)."""
    nic_bandwidth_bytes_per_s: Bandwidth | None = Field(None, alias="nic_bandwidth")
    """NIC limit; every link to or from this node is capped by it."""
    memory_bytes: Size | None = Field(None, alias="memory")
    """Memory per GPU, overriding the catalog (required in practice for ``CPU`` nodes)."""

    @field_validator("gpu", mode="before")
    @classmethod
    def _gpu_as_text(cls, value: Any) -> Any:
        # `gpu: 4090` unquoted is an int in YAML; it still names a GPU.
        return str(value) if isinstance(value, int) and not isinstance(value, bool) else value

    @field_validator("gpu")
    @classmethod
    def _known_gpu(cls, value: str) -> str:
        kind = lookup_gpu(value)
        if kind is None:
            raise ValueError(f"unknown GPU {value!r}; known: {known_gpu_names()}")
        return kind.name

    @property
    def kind(self) -> GpuKind:
        return GPU_CATALOG[self.gpu]

    @property
    def label(self) -> str:
        """GPU kind with count, e.g. ``L4x2``; the key for profiles and throughput tables."""
        return self.gpu if self.num_gpus == 1 else f"{self.gpu}x{self.num_gpus}"

    @property
    def vram_bytes(self) -> float:
        """Memory of the whole node (all its GPUs)."""
        per_gpu = self.memory_bytes if self.memory_bytes is not None else self.kind.vram_bytes
        return per_gpu * self.num_gpus


class CoordinatorSpec(_Frozen):
    """Where the coordinator (source and sink of every request's tokens) runs."""

    region: str | None = None
    address: str | None = None
    nic_bandwidth_bytes_per_s: Bandwidth | None = Field(None, alias="nic_bandwidth")
    outbound: LinkParams | None = None
    """Coordinator -> any node (prompt tokens to the first stages); replaces the region figures."""
    inbound: LinkParams | None = None
    """Any node -> coordinator (sampled tokens from the last stages); replaces the region figures."""
    token_cpu_s: Duration | None = Field(None, alias="token_cpu")
    """CPU time the coordinator spends per token it streams (receive it, detokenize, send it to
    the caller): the simulator passes every token through a FIFO server with this service time
    before its caller sees it (:mod:`helix.sim.hop`). None: free, as for a coordinator with
    cores of its own (GPU clusters). Measured by ``scripts/bench_live.py``'s calibration."""
    request_cpu_s: Duration | None = Field(None, alias="request_cpu")
    """CPU time the coordinator spends per request apart from its tokens (HTTP, checks, the
    reply's stream): the request waits for it in the same FIFO before it is scheduled. None:
    free. Measured by ``scripts/bench_live.py``'s calibration."""
    shared_cpu_s: Duration | None = Field(None, alias="shared_cpu")
    """CPU time per streamed token that processes other than the workers (the coordinator, a
    load generator on the same machine) spend on the workers' cores: the simulator takes it from
    the workers busy at that moment (their next steps get longer). None: the workers' cores are
    their own. Measured by ``scripts/bench_live.py``'s calibration."""


class WorkloadSpec(_Frozen):
    """The request mix the cluster is sized for (defaults: Azure conversation trace, filtered)."""

    mean_prompt_tokens: float = Field(763.0, gt=0)
    mean_output_tokens: float = Field(232.0, gt=0)
    resident_prompt_tokens: float | None = Field(None, gt=0)
    """Mean prompt of the requests *in flight*: longer outputs stay longer, so when prompt and
    output lengths are correlated this is E[prompt x output] / E[output], not the mean prompt
    (Azure conversation trace, filtered: 924 vs 763). It sizes how many requests a node's KV
    holds (:mod:`planner.prediction`). None: the mean prompt (lengths independent)."""


class PerformanceSpec(_Frozen):
    """Optional measured inputs that override the analytic cost model, keyed by node label
    (``L4``, ``L4x2``...): a profile directory replaces layer times; a table replaces T(k)."""

    profiles: dict[str, str] = Field(default_factory=dict)
    """Label -> folder with ``prompt_bs2time.csv`` and ``decode_bs2time.csv`` (ms per layer)."""
    throughput_tables: dict[str, tuple[Annotated[float, Field(gt=0)], ...]] = Field(
        default_factory=dict)
    """Label -> T(1..n) tokens/s while holding k layers; the node then holds at most n layers."""

    @field_validator("throughput_tables")
    @classmethod
    def _non_empty(cls, value: dict[str, tuple[float, ...]]) -> dict[str, tuple[float, ...]]:
        for label, table in value.items():
            if not table:
                raise ValueError(f"throughput table for {label!r} is empty")
        return value


class ClusterSpec(_Frozen):
    """A whole cluster: nodes, regions, links, model, workload. Build with :func:`load_cluster`."""

    model_ref: str = Field(alias="model")
    """Catalog name or path to a Hugging Face checkpoint folder / config.json, or to a GGUF file."""
    dtype: str = "float16"
    coordinator: CoordinatorSpec = Field(default_factory=CoordinatorSpec)
    workload: WorkloadSpec = Field(default_factory=WorkloadSpec)
    serving: ServingSpec = Field(default_factory=ServingSpec)
    regions: dict[str, LinkParams]
    """Region name -> bandwidth/latency between two nodes inside it."""
    inter_region: LinkParams | None = None
    """Default between any two regions; None leaves regions unconnected unless overridden."""
    region_links: tuple[RegionLink, ...] = ()
    links: tuple[NodeLink, ...] = ()
    """Per-pair overrides of the region (and coordinator) figures."""
    only_listed_links: bool = False
    """When true, only the pairs in ``links`` are connected (for clusters that are not fully
    connected); otherwise region and coordinator figures connect every pair."""
    nodes: tuple[NodeSpec, ...] = Field(min_length=1)
    performance: PerformanceSpec = Field(default_factory=PerformanceSpec)

    _model: ModelSpec = PrivateAttr()
    _profiles: dict[str, MeasuredProfile] = PrivateAttr(default_factory=dict)
    _base_dir: Path | None = PrivateAttr(default=None)
    _directed: dict[tuple[str, str], NodeLink] = PrivateAttr(default_factory=dict)
    _undirected: dict[frozenset[str], NodeLink] = PrivateAttr(default_factory=dict)
    _by_name: dict[str, NodeSpec] = PrivateAttr(default_factory=dict)

    @field_validator("dtype")
    @classmethod
    def _known_dtype(cls, value: str) -> str:
        return known_dtype(value)

    @field_validator("nodes", mode="before")
    @classmethod
    def _expand_counts(cls, value: Any) -> Any:
        return expand_node_groups(value)[0]

    @model_validator(mode="before")
    @classmethod
    def _step_budget_for_the_workload(cls, data: Any) -> Any:
        return _default_step_budget(data)

    @model_validator(mode="after")
    def _check_references(self, info: ValidationInfo) -> "ClusterSpec":
        _check_cluster(self)
        # Names are unique (checked above); link() looks both ends up for every pair of nodes.
        self._by_name = {n.name: n for n in self.nodes}
        for link in self.links:  # the first entry for a pair wins
            if link.between is not None:
                self._undirected.setdefault(frozenset(link.between), link)
            else:
                self._directed.setdefault(link.ends, link)
        base_dir = (info.context or {}).get("base_dir")
        self._base_dir = Path(base_dir) if base_dir else None
        self._model = resolve_model(self.model_ref, self._base_dir)
        self._profiles = {label: load_profile(self._resolve(path), label)
                          for label, path in self.performance.profiles.items()}
        return self

    def _resolve(self, path: str) -> Path:
        p = Path(path)
        if not p.is_absolute() and self._base_dir is not None:
            return self._base_dir / p
        return p

    # --- derived views ----------------------------------------------------------------------------
    @property
    def model(self) -> ModelSpec:
        return self._model

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def profiles(self) -> dict[str, MeasuredProfile]:
        return dict(self._profiles)

    @property
    def coordinator_region(self) -> str:
        return self.coordinator.region or next(iter(self.regions))

    def node(self, name: str) -> NodeSpec:
        return self._by_name[name]

    def region_of(self, vertex: str) -> str:
        if vertex == COORDINATOR:
            return self.coordinator_region
        node = self.node(vertex)
        return node.region or next(iter(self.regions))

    def link(self, a: str, b: str) -> LinkParams | None:
        """Bandwidth/latency from ``a`` to ``b`` (node names or ``coordinator``), or None when they
        are not connected. Precedence: a directed override (``from``/``to``), a ``between``
        override, the coordinator's ``outbound``/``inbound`` figures, then the region's own figures
        (same region) or the region-pair override or the inter-region default; NIC limits cap it."""
        if a == b:
            return None
        base = self._pair_override(a, b)
        if base is None and not self.only_listed_links:
            base = self._coordinator_path(a, b) or \
                self._region_path(self.region_of(a), self.region_of(b))
        if base is None:
            return None
        caps = [base.bandwidth_bytes_per_s] + [c for c in (self._nic(a), self._nic(b)) if c]
        return LinkParams.model_construct(bandwidth_bytes_per_s=min(caps), latency_s=base.latency_s)

    def _pair_override(self, a: str, b: str) -> LinkParams | None:
        return self._directed.get((a, b)) or self._undirected.get(frozenset((a, b)))

    def _coordinator_path(self, a: str, b: str) -> LinkParams | None:
        if a == COORDINATOR:
            return self.coordinator.outbound
        if b == COORDINATOR:
            return self.coordinator.inbound
        return None

    def region_link(self, ra: str, rb: str) -> LinkParams | None:
        """Bandwidth/latency between two nodes of regions ``ra`` and ``rb`` by the region figures
        alone (the pair's override, else the inter-region default; None: not connected)."""
        return self._region_path(ra, rb)

    def _region_path(self, ra: str, rb: str) -> LinkParams | None:
        if ra == rb:
            return self.regions[ra]
        for link in self.region_links:
            if set(link.regions) == {ra, rb}:
                return link
        return self.inter_region

    def _nic(self, vertex: str) -> float | None:
        if vertex == COORDINATOR:
            return self.coordinator.nic_bandwidth_bytes_per_s
        return self.node(vertex).nic_bandwidth_bytes_per_s

    def content_hash(self) -> str:
        """Stable hash of the validated content (not of the file's formatting)."""
        blob = json.dumps(self.to_dict(), sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        """Plain data with units written out; :func:`parse_cluster` reads it back identically."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)


# --- validation helpers ---------------------------------------------------------------------------

def step_budget_floor(mean_prompt: float, mean_output: float) -> int:
    """The smallest chunked step budget that holds one decode with its share of prompt tokens
    (the cost model's saturated step holds decodes : prompts as output : prompt)."""
    need = max(1, math.ceil((mean_prompt + mean_output) / mean_output))
    while need * mean_output // (mean_prompt + mean_output) < 1:   # the cost model's test, exactly
        need += 1
    return need


def _default_step_budget(data: Any) -> Any:
    """A spec that leaves ``serving.chunk_tokens`` unset (or ``auto``) gets the default budget, or,
    for a workload whose prompts are too long for it to hold one decode with its share of prompt
    tokens (mean prompt / mean output above the default less one: 255), the smallest power of
    two that does: a default the user never chose must not make their spec an error."""
    if not isinstance(data, dict):
        return data
    serving = data.get("serving")
    if serving is None:
        serving = {}
    if not isinstance(serving, dict) or sets_step_budget(serving):
        return data
    workload = data.get("workload") or {}
    fields = WorkloadSpec.model_fields
    try:
        need = step_budget_floor(
            float(workload.get("mean_prompt_tokens", fields["mean_prompt_tokens"].default)),
            float(workload.get("mean_output_tokens", fields["mean_output_tokens"].default)))
    except (AttributeError, TypeError, ValueError, ZeroDivisionError, OverflowError):
        return data   # the workload's own validation says what is wrong with it
    if need <= DEFAULT_STEP_TOKENS:
        return data
    return {**data, "serving": resolve_step_budget(serving, 1 << (need - 1).bit_length())}


def _check_step_budget(spec: ClusterSpec) -> None:
    """A chunked step budget must hold one decode with its share of prompt tokens (the cost
    model's saturated step holds decodes : prompts as o : p): smaller, every node's T(k) is 0 and
    the planner could only say the nodes hold no layers."""
    chunk, w = spec.serving.chunk_tokens, spec.workload
    p, o = w.mean_prompt_tokens, w.mean_output_tokens
    need = step_budget_floor(p, o)
    if 0 < chunk < need:
        raise ValueError(f"serving.chunk_tokens: {chunk} cannot hold a step's decode with its share "
                         f"of prompt tokens ((mean prompt + output) / output = {(p + o) / o:.2f} "
                         f"for this workload); use 0 (whole prompts) or >= {need}")


def _check_cluster(spec: ClusterSpec) -> None:
    if not spec.regions:
        raise ValueError("regions: at least one region is needed")
    known = ", ".join(spec.regions)
    seen: set[str] = set()
    for i, node in enumerate(spec.nodes):
        if node.name in seen:
            raise ValueError(f"nodes[{i}].name: duplicate node name {node.name!r}")
        if node.name == COORDINATOR:
            raise ValueError(f"nodes[{i}].name: {COORDINATOR!r} is reserved")
        seen.add(node.name)
        if node.region is None and len(spec.regions) > 1:
            raise ValueError(f"nodes[{i}].region: missing (the spec has several regions: {known})")
        if node.region is not None and node.region not in spec.regions:
            raise ValueError(f"nodes[{i}].region: unknown region {node.region!r}; known: {known}")
    _check_step_budget(spec)
    if spec.coordinator.region is not None and spec.coordinator.region not in spec.regions:
        raise ValueError(f"coordinator.region: unknown region {spec.coordinator.region!r}; "
                         f"known: {known}")
    for i, rl in enumerate(spec.region_links):
        for r in rl.regions:
            if r not in spec.regions:
                raise ValueError(f"region_links[{i}].regions: unknown region {r!r}; known: {known}")
    vertices = seen | {COORDINATOR}
    for i, link in enumerate(spec.links):
        for field, v in zip(("between", "between") if link.between else ("from", "to"), link.ends):
            if v not in vertices:
                raise ValueError(f"links[{i}].{field}: unknown node {v!r}")
    labels = {n.label for n in spec.nodes}
    for section in ("profiles", "throughput_tables"):
        for label in getattr(spec.performance, section):
            if label not in labels:
                raise ValueError(f"performance.{section}: {label!r} matches no node; node labels: "
                                 f"{', '.join(sorted(labels))}")


def parse_cluster(data: Any, source: str = "cluster spec", base_dir: Path | None = None
                  ) -> ClusterSpec:
    """Validate already-parsed YAML data. Raises :class:`SpecError` with one clear line."""
    if not isinstance(data, dict):
        raise SpecError(f"{source}: expected a mapping at top level, got {type(data).__name__}")
    try:
        _, origin = expand_node_groups(data.get("nodes"))
    except ValueError as exc:
        raise SpecError(f"{source}: nodes: {exc}") from None
    try:
        return ClusterSpec.model_validate(data, context={"base_dir": base_dir})
    except ValidationError as exc:
        raise SpecError(point_at_entries(str(first_error(exc, source)), origin)) from None
    except SpecError as exc:  # raised while resolving the model or reading a profile
        raise SpecError(f"{source}: {exc}") from None


def load_cluster(path: str | Path) -> ClusterSpec:
    """Read and validate a cluster YAML file."""
    p = Path(path)
    return parse_cluster(read_yaml(p, "cluster spec"), source=str(p), base_dir=p.parent)
