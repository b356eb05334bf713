"""A small well-formed live-view frame (``helix.cluster/1``) for tests of the checker and the page."""

from __future__ import annotations

from helix.core.cluster_frame import SCHEMA


def frame(time_s: float = 100.0, state: str = "serving") -> dict:
    """A small well-formed frame: two nodes in two regions, one pipeline, one link, one event."""
    return {
        "schema": SCHEMA, "time_s": time_s, "model": "tiny",
        "nodes": [{"name": "a", "gpu": "L4", "region": "us", "layers": [0, 4], "state": "serving",
                   "steps_per_s": 12.5, "busy": 0.4, "kv_used_tokens": 64, "kv_capacity_tokens": 1024,
                   "requests": 2},
                  {"name": "b", "gpu": "A100-40G", "region": "eu", "layers": [4, 8], "state": state,
                   "steps_per_s": None, "busy": None, "kv_used_tokens": None,
                   "kv_capacity_tokens": 2048, "requests": 0}],
        "pipelines": [{"id": "a>b", "nodes": ["a", "b"], "in_flight": 2, "decode_tokens_per_s": 30.0}],
        "links": [{"from_region": "us", "to_region": "eu", "bytes_per_s": 1.5e6,
                   "node_pairs": 1, "bandwidth_bytes_per_s": 1.25e7}],
        "cluster": {"requests_per_s": 1.5, "ttft_p50_s": 0.1, "ttft_p99_s": None, "tpot_p50_s": 0.02,
                    "tpot_p99_s": 0.05, "window_s": 60},
        "events": [{"time_s": time_s - 5, "kind": "failure", "detail": "b is dead (was suspect)"}],
    }
