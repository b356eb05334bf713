"""Text handling (tokenizer, chat template, stop strings while streaming) and CLI bad-input paths."""

from __future__ import annotations

import json
import shutil

import pytest

from coordinator.chat_template import load_chat_template
from coordinator.textcodec import DEFAULT_CHAT_TEMPLATE, Detokenizer, TextCodec
from helix.cli import main
from helix.core.errors import HelixUserError
from helix.commands.demo_checkpoint import CHAT_TEMPLATE, build_tokenizer


@pytest.fixture(scope="module")
def codec_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("codec")
    build_tokenizer().save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "chat_template": CHAT_TEMPLATE}))
    (path / "config.json").write_text(json.dumps({"eos_token_id": 2, "vocab_size": 512,
                                                  "max_position_embeddings": 512}))
    return path


def test_no_bos_without_a_post_processor_and_chat_template_from_the_checkpoint(codec_dir):
    c = TextCodec(codec_dir)
    # The demo tokenizer has no post-processor: like transformers, no BOS on a completion.
    assert c.encode("Helix serves")[0] != 1 and c.decode(c.encode("Helix serves")) == "Helix serves"
    msgs = [{"role": "user", "content": "hi"}]
    assert c.render_chat(msgs) == "<s>[user] hi\n[assistant] "
    ids = c.encode_chat(msgs)
    assert ids[0] == 1 and ids[1] != 1          # the template wrote BOS; no second one
    assert c.eos_token_ids == (2,) and c.max_context_tokens == 512


def test_builtin_chat_template_only_when_asked_for(codec_dir, tmp_path):
    shutil.copytree(codec_dir, tmp_path / "c")
    (tmp_path / "c" / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>"}))
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    with pytest.raises(HelixUserError, match="--chat-template"):   # no silent fallback
        TextCodec(tmp_path / "c").render_chat(msgs)
    c = TextCodec(tmp_path / "c", load_chat_template("builtin"))
    assert c.chat_template.text == DEFAULT_CHAT_TEMPLATE
    assert c.render_chat(msgs) == "<|system|>\nS\n<|user|>\nU\n<|assistant|>\n"
    # Plain text: the post-processor decides the special tokens, as for a completion.
    assert c.encode_chat(msgs) == c.encode(c.render_chat(msgs))


def test_streamed_text_never_shows_what_a_stop_string_cuts(codec_dir):
    c = TextCodec(codec_dir)
    ids = c.encode("Each worker holds a contiguous slice of layers", add_special_tokens=False)
    full = c.decode(ids)
    stop = "contiguous"
    d = Detokenizer(c, (stop,))
    shown = ""
    for k, t in enumerate(ids):
        shown += d.add(t, final=k == len(ids) - 1)
        assert stop not in shown
        if d.stopped:
            break
    assert d.stopped and shown == full[:full.find(stop)]
    # Without a stop string everything arrives, in order.
    d = Detokenizer(c)
    assert "".join(d.add(t, final=k == len(ids) - 1) for k, t in enumerate(ids)) == full


def test_serve_bad_inputs_are_one_line_errors(tmp_path, capsys, tiny_model):
    ckpt, _ = tiny_model
    assert main(["serve", str(tmp_path / "nope.yaml"), "--model", str(ckpt)]) == 2
    assert "no such file" in capsys.readouterr().err
    from tests.builders.serving import branching_plan
    branching_plan().save(tmp_path / "plan.yaml")
    assert main(["serve", str(tmp_path / "plan.yaml"), "--model", str(tmp_path / "missing")]) == 2
    assert "no such checkpoint folder" in capsys.readouterr().err
    assert main(["serve", str(tmp_path / "plan.yaml"), "--model", str(ckpt),
                 "--external", "cpu-9"]) == 2
    assert "not in the plan" in capsys.readouterr().err
    other = tmp_path / "plan4.yaml"
    other.write_text((tmp_path / "plan.yaml").read_text().replace("num_layers: 8", "num_layers: 4"))
    assert main(["serve", str(other), "--model", str(ckpt)]) == 2
    assert "places 4 layers" in capsys.readouterr().err
    assert main(["serve", str(tmp_path / "plan.yaml"), "--model", str(ckpt),
                 "--chat-template", str(tmp_path / "no-such.jinja")]) == 2
    err = capsys.readouterr().err
    assert "--chat-template" in err and "no such file" in err and len(err.strip().splitlines()) == 1
    assert main(["serve", str(tmp_path / "plan.yaml"), "--model", str(ckpt),
                 "--worker-niceness", "20"]) == 2
    assert "--worker-niceness" in capsys.readouterr().err
