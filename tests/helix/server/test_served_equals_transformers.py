"""What the OpenAI API serves equals ``transformers`` end to end, tokenizer included:
the demo checkpoint's byte-level tokenizer adds no BOS (no post-processor), so the oracle tokenizes
with ``AutoTokenizer``, generates greedily and decodes with it; the served text must be the same, for
completions and chat. Three real workers, the coordinator and uvicorn in this process."""

from __future__ import annotations

import pytest

httpx = pytest.importorskip("httpx")
transformers = pytest.importorskip("transformers")

from tests.builders.serving import PROMPTS  # noqa: E402
from tests.builders.stack import MODEL_NAME, local_stack  # noqa: E402

MAX_TOKENS = 8


def _hf_text(model, tok, ids) -> str:
    import torch
    out = model.generate(torch.tensor([list(ids)]), max_new_tokens=MAX_TOKENS, do_sample=False,
                         eos_token_id=tok.eos_token_id, pad_token_id=0)
    return tok.decode(out[0, len(ids):].tolist(), skip_special_tokens=True)


def test_completions_and_chat_equal_transformers_with_its_tokenizer(tiny_model):
    ckpt, model = tiny_model
    tok = transformers.AutoTokenizer.from_pretrained(str(ckpt))
    with local_stack(ckpt) as stack, httpx.Client(base_url=stack.url, timeout=60) as client:
        for prompt in PROMPTS[:5]:
            r = client.post("/v1/completions", json={"model": MODEL_NAME, "prompt": prompt,
                                                     "max_tokens": MAX_TOKENS, "temperature": 0})
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["text"] == _hf_text(model, tok, tok(prompt)["input_ids"]), prompt
            messages = [{"role": "user", "content": prompt}]
            want_ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            want_ids = want_ids["input_ids"] if hasattr(want_ids, "keys") else want_ids
            r = client.post("/v1/chat/completions", json={"model": MODEL_NAME, "messages": messages,
                                                          "max_tokens": MAX_TOKENS, "temperature": 0})
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["message"]["content"] == _hf_text(model, tok, want_ids)
