"""The API guide's example of the built-in chat template (docs/api.md) is what
:data:`DEFAULT_CHAT_TEMPLATE` renders (``--chat-template builtin``)."""

from __future__ import annotations

import re
from pathlib import Path

from coordinator.chat_template import load_chat_template
from coordinator.textcodec import DEFAULT_CHAT_TEMPLATE, TextCodec

API_DOC = Path(__file__).resolve().parents[3] / "docs" / "api.md"


def test_the_api_guide_shows_the_default_chat_template(tiny_model, tmp_path):
    text = API_DOC.read_text()
    assert "DEFAULT_CHAT_TEMPLATE" in text
    example = re.search(r"`DEFAULT_CHAT_TEMPLATE`.*?```text\n(.*?)```", text, re.DOTALL).group(1)
    # The demo checkpoint has its own template; this copy has none and asks for the built-in one.
    for name in ("tokenizer.json", "config.json"):
        (tmp_path / name).write_bytes((Path(tiny_model[0]) / name).read_bytes())
    assert "--chat-template builtin" in text
    codec = TextCodec(tmp_path, load_chat_template("builtin"))
    assert codec.chat_template.text == DEFAULT_CHAT_TEMPLATE
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]
    assert codec.render_chat(messages) == example
