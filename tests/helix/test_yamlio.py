"""helix.core.yamlio: libyaml where PyYAML has it, with the same documents, text and error lines as
PyYAML's Python parser and emitter."""

from __future__ import annotations

import pytest
import yaml

from helix.core import yamlio
from helix.core.errors import SpecError
from helix.core.plan import ArcFlow, Plan
from helix.core.slices import LayerSlice


def test_plan_text_and_document_as_the_python_yaml(tmp_path):
    plan = Plan(model="llama-2-7b", num_layers=32,
                placements=(LayerSlice("a", 0, 16), LayerSlice("b", 16, 32)),
                arc_flows=(ArcFlow("coordinator", "a", 1.5), ArcFlow("a", "b", 1.5),
                           ArcFlow("b", "coordinator", 1.5)), max_flow_tokens_per_s=1.5,
                extras={"note": "ünïcode, a: colon", "when": None, "flows": [0.1, 1e-9, 3]})
    text = plan.to_yaml()
    assert text == yaml.safe_dump(plan.to_dict(), sort_keys=False)
    (tmp_path / "plan.yaml").write_text(text)
    assert yamlio.read_yaml(tmp_path / "plan.yaml") == yaml.safe_load(text)
    assert Plan.load(tmp_path / "plan.yaml") == plan


def test_syntax_error_line_is_the_python_parsers(tmp_path, monkeypatch):
    bad = tmp_path / "bad.yaml"
    bad.write_text("nodes:\n  - name: a\n    gpu: [L4\n")
    with pytest.raises(SpecError) as fast:
        yamlio.read_yaml(bad, "cluster spec")
    monkeypatch.setattr(yamlio, "_FAST_LOADER", None)   # PyYAML without libyaml
    with pytest.raises(SpecError) as python:
        yamlio.read_yaml(bad, "cluster spec")
    assert str(fast.value) == str(python.value)
    assert "invalid YAML at line" in str(fast.value)
