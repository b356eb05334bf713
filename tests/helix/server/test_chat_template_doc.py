"""README's example of the default chat template is what :data:`DEFAULT_CHAT_TEMPLATE` renders."""

from __future__ import annotations

import re
from pathlib import Path

from coordinator.textcodec import DEFAULT_CHAT_TEMPLATE, TextCodec

README = Path(__file__).resolve().parents[3] / "README.md"


def test_readme_shows_the_default_chat_template(tiny_model, tmp_path):
    text = README.read_text()
    assert "DEFAULT_CHAT_TEMPLATE" in text
    example = re.search(r"`DEFAULT_CHAT_TEMPLATE`.*?```text\n(.*?)```", text, re.S).group(1)
    # The demo checkpoint has its own template; without one the codec falls back to the default.
    for name in ("tokenizer.json", "config.json"):
        (tmp_path / name).write_bytes((Path(tiny_model[0]) / name).read_bytes())
    codec = TextCodec(tmp_path)
    assert codec.chat_template == DEFAULT_CHAT_TEMPLATE
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]
    assert codec.render_chat(messages) == example
