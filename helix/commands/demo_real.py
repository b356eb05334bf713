"""``helix demo``'s real model: SmolLM2-135M-Instruct from its GGUF file, answering questions.

1. find or fetch the GGUF (:func:`helix.commands.demo_model.ensure_smollm2`);
2. write a two-node cluster spec naming that file and plan it (the planner reads the model's shape
   from the GGUF);
3. serve the plan on a local Ray, as ``helix serve --model SmolLM2-135M-Instruct.Q4_1.gguf`` would
   (each worker loads and dequantizes only its slice of the file);
4. ask the questions through the ``openai`` client (chat, greedy, the served token ids returned);
5. ask ``transformers`` the same on the same file (its tokenizer and chat template, float32,
   greedy), and put each answer beside Helix's, checked token for token.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
from dataclasses import dataclass
from pathlib import Path

from helix.core.plan import Plan

QUESTIONS = ("What is the capital of France?", "Name three primary colors.", "What is 2 + 3?")

SPEC = """\
# Written by helix demo: two CPU "nodes" on this machine serving SmolLM2-135M-Instruct (30 layers)
# from its GGUF file. 512 MiB each cannot hold the float32 model, so the planner splits it.
model: {model}
dtype: float32
workload: {{mean_prompt_tokens: 40, mean_output_tokens: 24}}
serving: {{max_batch_seqs: 8}}
regions:
  local: {{bandwidth: 1GB/s, latency: 100us}}
nodes:
  - {{name: cpu-0, gpu: CPU, memory: 512MiB, address: 127.0.0.1}}
  - {{name: cpu-1, gpu: CPU, memory: 512MiB, address: 127.0.0.1}}
"""


@dataclass(frozen=True)
class Answer:
    """One question: Helix's answer and ``transformers``' on the same GGUF."""

    question: str
    text: str
    token_ids: tuple[int, ...]
    reference_text: str
    reference_ids: tuple[int, ...]

    @property
    def matches(self) -> bool:
        return self.token_ids == self.reference_ids


@dataclass(frozen=True)
class RealReport:
    model: str
    spec_path: Path
    plan: Plan
    answers: tuple[Answer, ...]

    @property
    def mismatches(self) -> tuple[int, ...]:
        return tuple(i for i, a in enumerate(self.answers) if not a.matches)


def write_spec(gguf: Path, folder: Path) -> Path:
    """The demo's cluster spec, naming ``gguf``, written into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "smollm2-local2.yaml"
    path.write_text(SPEC.format(model=str(gguf.resolve())))
    return path


def load_reference(gguf: Path):
    """``transformers``' (tokenizer, float32 model) from the GGUF file, its progress bars off."""
    import torch
    import transformers
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    kw = {"gguf_file": gguf.name}
    tok = transformers.AutoTokenizer.from_pretrained(str(gguf.parent), **kw)
    # Its GGUF loader draws a tqdm bar of its own, which the switch above does not reach.
    with contextlib.redirect_stderr(io.StringIO()):
        model = transformers.AutoModelForCausalLM.from_pretrained(str(gguf.parent), dtype=torch.float32,
                                                                  **kw).eval()
    return tok, model


def reference_answer(reference, question: str, max_tokens: int) -> tuple[int, ...]:
    """``transformers``' greedy answer ids (EOS included, as Helix reports it)."""
    import torch
    tok, model = reference
    ids = tok.apply_chat_template([{"role": "user", "content": question}],
                                  add_generation_prompt=True, tokenize=True)
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    out = model.generate(torch.tensor([ids]), max_new_tokens=max_tokens, do_sample=False,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    return tuple(out[0, len(ids):].tolist())


async def _ask(url: str, model: str, questions, max_tokens: int) -> list[tuple[str, tuple[int, ...]]]:
    import openai

    async def one(client, question):
        r = await client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": question}], max_tokens=max_tokens,
            temperature=0, logprobs=True, extra_body={"return_tokens_as_token_ids": True})
        ids = tuple(int(e.token.removeprefix("token_id:")) for e in r.choices[0].logprobs.content)
        return r.choices[0].message.content, ids
    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="demo", max_retries=0,
                                  timeout=300) as client:
        return await asyncio.gather(*(one(client, q) for q in questions))


def run_real_demo(gguf: Path, cache_dir: Path, questions=QUESTIONS, max_tokens: int = 48,
                  log=print, reference=None) -> RealReport:
    """Plan, serve and ask (see the module doc). ``reference``: ``transformers``' (tokenizer,
    model) when the caller already loaded them (:func:`load_reference`)."""
    from helix.commands.demo import describe_plan, plan_local3
    from helix.server.http import HttpThread
    from helix.server.stack import ServeOptions, ServeStack
    model_name = gguf.stem
    spec_path = write_spec(gguf, cache_dir)
    log(f"real model: {gguf} (cluster spec naming it: {spec_path})")
    plan = plan_local3(spec_path)
    log(describe_plan(plan))
    if not os.environ.get("RAY_ADDRESS"):
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")   # as for the tiny model
    stack = ServeStack(plan, str(gguf), ServeOptions(model_name=model_name), progress=log).start()
    try:
        http = HttpThread(stack.app)
        try:
            log(f"asking {len(questions)} questions at {http.url}/v1")
            served = asyncio.run(_ask(http.url, model_name, questions, max_tokens))
        finally:
            http.stop()
    finally:
        stack.close()
    log("reference: transformers on the same GGUF (float32, greedy) ...")
    reference = reference or load_reference(gguf)
    tok = reference[0]
    answers = []
    for question, (text, ids) in zip(questions, served):
        want = reference_answer(reference, question, max_tokens)
        answers.append(Answer(question, text, ids, tok.decode(want, skip_special_tokens=True), want))
    return RealReport(model_name, spec_path, plan, tuple(answers))


def format_real_report(r: RealReport) -> str:
    lines = []
    for a in r.answers:
        lines += [f"Q: {a.question}",
                  f"  helix:        {_one_line(a.text)}",
                  f"  transformers: {_one_line(a.reference_text)}",
                  f"  {'same' if a.matches else 'DIFFERENT'} {len(a.token_ids)} tokens"
                  + ("" if a.matches else f" (transformers: {len(a.reference_ids)})")]
    if r.mismatches:
        lines.append(f"MISMATCH: answers {list(r.mismatches)} differ from transformers on the same GGUF")
    else:
        lines.append(f"all {len(r.answers)} answers of {r.model} match transformers on the same GGUF, "
                     f"token for token")
    return "\n".join(lines)


def _one_line(text: str) -> str:
    return text.replace("\n", " / ")
