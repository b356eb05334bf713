"""The Plan: where every layer lives and how tokens flow, as written to ``plan.yaml``.

A plan is the planner's output and the input of ``helix simulate`` and ``helix serve``. It is a
frozen data object with a versioned YAML schema; it imports nothing from planner/coordinator/worker.

Vertices of the flow network are node names plus :data:`COORDINATOR` (source and sink are both the
coordinator: tokens leave it for the first stage and come back from the last).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from helix.core.errors import SpecError
from helix.core.serving import ServingLimits
from helix.core.slices import LayerSlice
from helix.core.yamlio import dump_yaml, read_yaml

PLAN_SCHEMA_VERSION = 1
COORDINATOR = "coordinator"


@dataclass(frozen=True)
class ArcFlow:
    """Tokens/s carried on the arc ``src -> dst`` in the max-flow solution."""

    src: str
    dst: str
    flow_tokens_per_s: float


@dataclass(frozen=True)
class Prediction:
    """What users get from a plan, predicted analytically (:mod:`planner.prediction`)."""

    prompt_decode_tokens_per_s: float
    """Offline (saturated): prompt + decode tokens/s, the unit of the max flow."""
    decode_tokens_per_s: float
    """Offline: generated tokens/s."""
    requests_per_s: float
    pipelines: int
    """Distinct pipelines (source-to-sink paths) the plan's flows create."""
    requests_in_flight: float
    """Offline: requests holding KV at once, all pipelines together."""
    online_load: float
    """The fraction of ``requests_per_s`` at which the latencies below hold (Poisson arrivals)."""
    ttft_p50_s: float | None
    """Online: median time to first token."""
    tpot_p50_s: float | None
    """Online: median time per output token after the first."""


@dataclass(frozen=True)
class Plan:
    """A placement of a model's layers on a cluster, with its max-flow solution."""

    model: str
    num_layers: int
    placements: tuple[LayerSlice, ...]
    arc_flows: tuple[ArcFlow, ...]
    max_flow_tokens_per_s: float
    """Serving throughput of this placement (prompt + decode tokens/s)."""
    upper_bound_tokens_per_s: float | None = None
    """A proven upper bound on the max flow of *any* placement, or None when unknown."""
    method: str = "milp"
    solver: str | None = None
    solve_seconds: float = 0.0
    partial_inference: bool = True
    """Whether a stage may start inside the previous stage's range (running only the layers it lacks)."""
    spec_hash: str | None = None
    """Hash of the cluster spec this plan was made for (see ``ClusterSpec.content_hash``)."""
    serving: ServingLimits | None = None
    """What ``helix serve`` runs every worker with: the spec's serving limits, dtype and each node's
    KV pool (None in a plan made without a spec, which ``helix serve`` refuses)."""
    prediction: Prediction | None = field(default=None, compare=False)
    """What users get (:mod:`planner.prediction`): throughput at saturation, latencies at 75 % of
    it; None when not made (plans made outside ``planner.predicted``)."""
    extras: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    """Informational figures (depth, latency estimate, ...) kept in the file as written."""
    schema_version: int = PLAN_SCHEMA_VERSION

    @property
    def gap(self) -> float | None:
        """Relative optimality gap ``(bound - flow) / flow``; None without a bound."""
        if self.upper_bound_tokens_per_s is None or self.max_flow_tokens_per_s <= 0:
            return None
        return max(0.0, self.upper_bound_tokens_per_s - self.max_flow_tokens_per_s) / \
            self.max_flow_tokens_per_s

    def placement_of(self, node: str) -> LayerSlice:
        for p in self.placements:
            if p.node == node:
                return p
        raise KeyError(node)

    # --- serialization ----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["placements"] = [dataclasses.asdict(p) for p in self.placements]
        d["arc_flows"] = [dataclasses.asdict(a) for a in self.arc_flows]
        d["serving"] = None if self.serving is None else self.serving.to_dict()
        d["prediction"] = None if self.prediction is None else dataclasses.asdict(self.prediction)
        d["gap"] = self.gap
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "plan") -> "Plan":
        version = d.get("schema_version")
        if version != PLAN_SCHEMA_VERSION:
            raise SpecError(f"{where}: schema_version {version!r} is not supported "
                            f"(this Helix reads version {PLAN_SCHEMA_VERSION})")
        try:
            kwargs = {k: v for k, v in d.items() if k in {f.name for f in dataclasses.fields(cls)}}
            kwargs["placements"] = tuple(LayerSlice(**p) for p in d["placements"])
            kwargs["arc_flows"] = tuple(ArcFlow(**a) for a in d["arc_flows"])
            if d.get("prediction") is not None:
                kwargs["prediction"] = Prediction(**d["prediction"])
            if d.get("serving") is not None:
                kwargs["serving"] = ServingLimits.from_dict(d["serving"], where)
            return cls(**kwargs)
        except KeyError as exc:
            raise SpecError(f"{where}: missing field {exc.args[0]!r}") from None
        except TypeError as exc:
            raise SpecError(f"{where}: malformed plan: {exc}") from None

    def to_yaml(self) -> str:
        return dump_yaml(self.to_dict())

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_yaml())

    @classmethod
    def load(cls, path: str | Path) -> "Plan":
        p = Path(path)
        data = read_yaml(p, "plan")
        if not isinstance(data, dict):
            raise SpecError(f"plan {str(p)!r}: expected a mapping at top level")
        return cls.from_dict(data, where=f"plan {str(p)!r}")
