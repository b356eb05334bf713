"""An instruction-style checkpoint as ``transformers`` 5 saves one: the demo's tiny random LLaMA
(``model.save_pretrained``) with a ``PreTrainedTokenizerFast`` over the in-code tokenizer, ChatML's
special tokens added and a real chat template set, written by ``tokenizer.save_pretrained`` (so the
template lands in ``chat_template.jinja``, not in ``tokenizer_config.json``)."""

from __future__ import annotations

from pathlib import Path

SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% endif %}")
"""SmolLM2-135M-Instruct's chat template (ChatML with a default system turn)."""

TOOL_TEMPLATE = ("{% for message in messages %}<tool>{{ message['role'] }}: {{ message['content'] }}"
                 "{% endfor %}{% if add_generation_prompt %}<tool>assistant: {% endif %}")
"""A second, different named template (``tool_use``), so a test sees which one was picked."""

SYSTEM_USER = [{"role": "system", "content": "Be brief."},
               {"role": "user", "content": "Each worker holds a contiguous slice"}]
MULTI_TURN = [{"role": "user", "content": "Helix serves one large language model"},
              {"role": "assistant", "content": "over a cluster of mixed GPUs"},
              {"role": "user", "content": "Chunked prefill cuts long prompts"}]


def chat_tokenizer(template):
    """The demo tokenizer as a ``PreTrainedTokenizerFast`` with ChatML's tokens and ``template``
    (a string, a dict of named templates, or None)."""
    from transformers import PreTrainedTokenizerFast

    from helix.commands.demo_checkpoint import build_tokenizer
    tok = PreTrainedTokenizerFast(tokenizer_object=build_tokenizer(), bos_token="<s>",
                                  eos_token="</s>", unk_token="<unk>")
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    if template is not None:
        tok.chat_template = template
    return tok


def write_chat_checkpoint(path: str | Path, template=SMOLLM2_TEMPLATE):
    """Write the checkpoint; returns (model, tokenizer), the ``transformers`` oracle."""
    from helix.commands.demo_checkpoint import write_tiny_checkpoint
    path = Path(path)
    model = write_tiny_checkpoint(path, chat_template=False)
    tok = chat_tokenizer(template)
    tok.save_pretrained(path)   # replaces the demo's tokenizer files
    return model, tok


def input_ids(encoded) -> list[int]:
    """``apply_chat_template(..., tokenize=True)``'s ids (transformers 5 returns a BatchEncoding)."""
    return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)
