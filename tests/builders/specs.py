"""Tiny valid cluster specs to mutate in tests."""

from __future__ import annotations

import copy
from typing import Any


def tiny_spec(**overrides: Any) -> dict[str, Any]:
    """Two regions, three nodes, LLaMA-2 70B: valid as written."""
    spec: dict[str, Any] = {
        "model": "llama-2-70b",
        "regions": {"east": {"bandwidth": "10Gbps", "latency": "1ms"},
                    "west": {"bandwidth": "10Gbps", "latency": "1ms"}},
        "inter_region": {"bandwidth": "100Mbps", "latency": "50ms"},
        "coordinator": {"region": "east"},
        "nodes": [
            {"name": "a100-{i}", "gpu": "A100-40G", "count": 4, "region": "east"},
            {"name": "l4-0", "gpu": "L4", "gpus": 2, "region": "west"},
        ],
    }
    spec.update(copy.deepcopy(overrides))
    return spec
