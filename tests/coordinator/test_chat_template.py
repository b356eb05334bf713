"""Chat templates wherever checkpoints keep them, and ``--chat-template``, against ``transformers``.

Checkpoints are written by ``transformers`` 5 itself (``save_pretrained``), so the template is where
real ones have it: ``chat_template.jinja``, ``additional_chat_templates/`` for named ones, or the
older ``tokenizer_config.json`` forms. The oracle is ``AutoTokenizer.apply_chat_template``."""

from __future__ import annotations

import json
import shutil

import pytest

transformers = pytest.importorskip("transformers")

from coordinator.chat_template import (BUILTIN_NAME, DEFAULT_CHAT_TEMPLATE,  # noqa: E402
                                       load_chat_template)
from coordinator.textcodec import TextCodec  # noqa: E402
from helix.core.errors import HelixUserError  # noqa: E402

from tests.builders.chat_checkpoint import (MULTI_TURN, SMOLLM2_TEMPLATE, SYSTEM_USER,  # noqa: E402
                                            TOOL_TEMPLATE, chat_tokenizer, input_ids)


def _hf_ids(ckpt, messages, **kw) -> list[int]:
    tok = transformers.AutoTokenizer.from_pretrained(str(ckpt))
    return input_ids(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, **kw))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Tokenizer files only (the codec reads no weights), saved by ``save_pretrained``."""
    path = tmp_path_factory.mktemp("saved_chat_tok")
    chat_tokenizer(SMOLLM2_TEMPLATE).save_pretrained(path)
    return path


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def test_template_in_chat_template_jinja_equals_transformers(saved):
    assert (saved / "chat_template.jinja").is_file()
    assert "chat_template" not in json.loads((saved / "tokenizer_config.json").read_text())
    codec = TextCodec(saved)
    assert codec.chat_template.source == str(saved / "chat_template.jinja")
    for messages in (SYSTEM_USER, MULTI_TURN):
        ids = codec.encode_chat(messages)
        assert ids == _hf_ids(saved, messages)
        assert ids[0] == codec.tokenizer.token_to_id("<|im_start|>")   # a special token, one id
    # No system turn: the template's own default system prompt, as transformers renders it.
    assert "named SmolLM" in codec.render_chat(MULTI_TURN)


def test_named_templates_saved_by_transformers_use_default(tmp_path):
    chat_tokenizer({"default": SMOLLM2_TEMPLATE, "tool_use": TOOL_TEMPLATE}).save_pretrained(tmp_path)
    assert (tmp_path / "additional_chat_templates" / "tool_use.jinja").is_file()
    codec = TextCodec(tmp_path)
    assert codec.encode_chat(SYSTEM_USER) == _hf_ids(tmp_path, SYSTEM_USER)
    assert "<tool>" not in codec.render_chat(SYSTEM_USER)


def test_named_templates_list_in_tokenizer_config_uses_default(saved, tmp_path):
    ckpt = _copy(saved, tmp_path / "c")
    (ckpt / "chat_template.jinja").unlink()
    cfg = json.loads((ckpt / "tokenizer_config.json").read_text())
    cfg["chat_template"] = [{"name": "tool_use", "template": TOOL_TEMPLATE},
                            {"name": "default", "template": SMOLLM2_TEMPLATE}]
    (ckpt / "tokenizer_config.json").write_text(json.dumps(cfg))
    codec = TextCodec(ckpt)
    assert "'default' of 2 named templates" in codec.chat_template_line()
    for messages in (SYSTEM_USER, MULTI_TURN):
        assert codec.encode_chat(messages) == _hf_ids(ckpt, messages)
    # Named templates without a default: none to use, as transformers refuses to pick one.
    cfg["chat_template"] = [{"name": "tool_use", "template": TOOL_TEMPLATE}]
    (ckpt / "tokenizer_config.json").write_text(json.dumps(cfg))
    with pytest.raises(HelixUserError, match="--chat-template"):
        TextCodec(ckpt).encode_chat(SYSTEM_USER)


def test_string_in_tokenizer_config_and_the_jinja_file_wins(saved, tmp_path):
    ckpt = _copy(saved, tmp_path / "c")
    (ckpt / "chat_template.jinja").unlink()
    cfg = json.loads((ckpt / "tokenizer_config.json").read_text())
    cfg["chat_template"] = TOOL_TEMPLATE
    (ckpt / "tokenizer_config.json").write_text(json.dumps(cfg))
    assert TextCodec(ckpt).encode_chat(SYSTEM_USER) == _hf_ids(ckpt, SYSTEM_USER)
    assert TextCodec(ckpt).chat_template_line() == str(ckpt / "tokenizer_config.json")
    # Both present (a checkpoint re-saved by hand): the file, as transformers loads it.
    (ckpt / "chat_template.jinja").write_text(SMOLLM2_TEMPLATE)
    ids = TextCodec(ckpt).encode_chat(SYSTEM_USER)
    assert ids == _hf_ids(ckpt, SYSTEM_USER) == _hf_ids(saved, SYSTEM_USER)


def test_no_template_refuses_chat_naming_the_flag(saved, tmp_path):
    ckpt = _copy(saved, tmp_path / "c")
    (ckpt / "chat_template.jinja").unlink()
    codec = TextCodec(ckpt)
    assert codec.chat_template is None and codec.chat_template_line().startswith("none")
    with pytest.raises(HelixUserError, match=r"no chat template.*--chat-template FILE\|STRING"):
        codec.encode_chat(SYSTEM_USER)
    assert codec.encode("Helix serves")   # completions are unaffected


def test_chat_template_flag_file_string_and_builtin(saved, tmp_path):
    ckpt = _copy(saved, tmp_path / "c")
    (ckpt / "chat_template.jinja").unlink()
    f = tmp_path / "tool.jinja"
    f.write_text(TOOL_TEMPLATE)
    by_file = load_chat_template(str(f))
    assert by_file.text == TOOL_TEMPLATE and by_file.source == f"--chat-template {f}"
    by_string = load_chat_template(TOOL_TEMPLATE)
    assert by_string.text == TOOL_TEMPLATE and "the template given" in by_string.source
    for template in (by_file, by_string):
        codec = TextCodec(ckpt, template)
        assert codec.encode_chat(SYSTEM_USER) == _hf_ids(ckpt, SYSTEM_USER, chat_template=TOOL_TEMPLATE)
    # The flag replaces a checkpoint's own template too.
    assert TextCodec(saved, by_file).render_chat(SYSTEM_USER).startswith("<tool>system: Be brief.")
    builtin = load_chat_template(BUILTIN_NAME)
    assert builtin.text == DEFAULT_CHAT_TEMPLATE and "built-in" in builtin.source
    text = TextCodec(ckpt, builtin).render_chat(SYSTEM_USER)
    assert text == "<|system|>\nBe brief.\n<|user|>\nEach worker holds a contiguous slice\n<|assistant|>\n"


@pytest.mark.parametrize("value,needle", [
    ("missing/template.jinja", "'missing/template.jinja': no such file, and not a template"),
    ("", "must not be empty"),
    ("{% for m in messages %}{{ m['content'] }", "line 1"),
])
def test_bad_chat_template_flag_is_one_line(value, needle):
    with pytest.raises(HelixUserError, match="--chat-template") as err:
        load_chat_template(value)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_a_directory_or_empty_file_is_refused(tmp_path):
    with pytest.raises(HelixUserError, match="not a template"):
        load_chat_template(str(tmp_path))
    (tmp_path / "empty.jinja").write_text("  \n")
    with pytest.raises(HelixUserError, match="empty"):
        load_chat_template(str(tmp_path / "empty.jinja"))


def test_a_broken_checkpoint_template_fails_at_start(saved, tmp_path):
    ckpt = _copy(saved, tmp_path / "c")
    (ckpt / "chat_template.jinja").write_text("{% if messages %}never closed")
    with pytest.raises(HelixUserError, match="chat_template.jinja"):
        TextCodec(ckpt)
    # The flag's template is used instead: the broken one is never compiled.
    assert TextCodec(ckpt, load_chat_template(BUILTIN_NAME)).render_chat(SYSTEM_USER)
    (ckpt / "chat_template.jinja").unlink()
    cfg = json.loads((ckpt / "tokenizer_config.json").read_text())
    (ckpt / "tokenizer_config.json").write_text(json.dumps({**cfg, "chat_template": 7}))
    with pytest.raises(HelixUserError, match="must be a string or a list"):
        TextCodec(ckpt)


def test_a_template_that_raises_on_the_messages_is_a_user_error(saved):
    strict = load_chat_template("{% if messages[0]['role'] != 'user' %}{{ raise_exception("
                                "'Conversation roles must start with user') }}{% endif %}"
                                "{{ messages[0]['content'] + 1 }}")
    codec = TextCodec(saved, strict)
    with pytest.raises(HelixUserError, match="roles must start with user"):
        codec.render_chat(SYSTEM_USER)
    with pytest.raises(HelixUserError, match="chat template: TypeError"):
        codec.render_chat(SYSTEM_USER[1:])
