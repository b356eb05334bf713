"""Pipelines whose output stopped, seen on the data plane (pure: times are passed in).

A frozen or cut-off worker is found by the stats polls only when a poll times out
(``HealthConfig.suspect_after_s``, 2 s by default); meanwhile every new request routed through it
waits. The coordinator sees sooner that a pipeline with requests in flight has sent nothing for
many times the gap it usually leaves between outputs. Such a pipeline is *stalled*; the nodes
that lie on stalled pipelines and on no pipeline still sending are the likely culprits, and they
get no new requests until output resumes (the requests they hold stay: the polls decide whether
the node is suspect or dead).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

Pipeline = tuple[str, ...]


@dataclass(frozen=True)
class StallConfig:
    """When a pipeline with requests in flight counts as stalled."""

    after_gaps: float = 10.0
    """Silence of this many of the pipeline's usual gaps between outputs (a running mean)."""
    min_s: float = 0.5
    """Never sooner than this (a long prompt step leaves a gap of its own)."""
    enabled: bool = True

    def __post_init__(self) -> None:
        if self.after_gaps <= 1 or self.min_s <= 0:
            raise ValueError(f"need after_gaps > 1 and min_s > 0, got {self.after_gaps}, {self.min_s}")


class StallWatch:
    """Per pipeline: when it last sent output and the usual gap between its outputs."""

    #: Weight of the newest gap in the running mean.
    SMOOTHING = 0.2
    #: Outputs closer than this are one message's (a batch of tokens): no gap between them.
    SAME_MESSAGE_S = 1e-3

    def __init__(self, config: StallConfig = StallConfig()) -> None:
        self.config = config
        self._last: dict[Pipeline, float] = {}
        self._gap: dict[Pipeline, float] = {}

    def output(self, pipeline: Pipeline, now_s: float) -> None:
        """``pipeline`` sent output (a token) at ``now_s``."""
        last = self._last.get(pipeline)
        if last is not None and now_s - last >= self.SAME_MESSAGE_S:
            gap, old = now_s - last, self._gap.get(pipeline)
            self._gap[pipeline] = gap if old is None else old + self.SMOOTHING * (gap - old)
        self._last[pipeline] = now_s

    def limit_s(self, pipeline: Pipeline) -> float | None:
        """How long ``pipeline`` may be silent with requests in flight: by its own usual gap, or,
        before it has one (a pipeline whose first tokens came in one message), by the largest of
        the other pipelines'; None while no pipeline has one."""
        gap = self._gap.get(pipeline)
        if gap is None:
            gap = max(self._gap.values(), default=None)
        return None if gap is None else max(self.config.min_s, self.config.after_gaps * gap)

    def stalled(self, in_flight_since: Mapping[Pipeline, float], now_s: float) -> list[Pipeline]:
        """The pipelines with requests in flight that have been silent past their limit.
        ``in_flight_since``: each pipeline with requests in flight, and when the oldest of them
        was sent to it (a pipeline is silent since the later of that and its last output)."""
        if not self.config.enabled:
            return []
        out = []
        for pipeline, since in in_flight_since.items():
            limit = self.limit_s(pipeline)
            if limit is not None and now_s - max(self._last.get(pipeline, since), since) > limit:
                out.append(pipeline)
        return out

    def sending(self, now_s: float) -> list[Pipeline]:
        """The pipelines whose last output is within their limit of ``now_s``."""
        return [p for p, last in self._last.items()
                if (limit := self.limit_s(p)) is not None and now_s - last <= limit]

    def culprits(self, stalled: Iterable[Pipeline], now_s: float) -> set[str]:
        """The likely culprits of ``stalled`` pipelines: their nodes on no pipeline still sending."""
        return _nodes(stalled) - _nodes(self.sending(now_s))

    def stalled_nodes(self, in_flight_since: Mapping[Pipeline, float], now_s: float) -> set[str]:
        """:meth:`culprits` of the pipelines :meth:`stalled` finds."""
        return self.culprits(self.stalled(in_flight_since, now_s), now_s)


def _nodes(pipelines: Iterable[Pipeline]) -> set[str]:
    return {n for p in pipelines for n in p}
