"""Structured output benchmark: what building a token automaton costs, and masking.

For each tokenizer and each ``response_format`` it times what the last stage does before a guided
request is admitted (``worker.guided``): the vocabulary (every token's bytes, once per engine) and
the ``outlines_core.Index`` of the format's regex (once per regex; cached after). Tokenizers:

- ``demo``: the demo checkpoint's (297 tokens, byte-level BPE, ``helix demo``'s);
- ``bpe32k``: a 32,000-token byte-level BPE trained here on the Python standard library's sources
  (no realistic checkpoint tokenizer is available offline; this one has Llama-2's vocabulary size
  and GPT-2's byte alphabet, so its automaton sizes are of that order).

Formats: the serving test's schema (``tests/helix/server/test_structured_output.py``), ``json_object``
(:data:`helix.server.structured.JSON_OBJECT`) and, with ``--deep``, outlines' own three-level form of
``{"type": "object"}`` (what ``json_object`` would cost without the two-level limit).

Also the sampler's mask (``worker.sampling._constrained``) on 8 rows of ``[8, 32000]`` logits, in
the state with the most allowed tokens (inside a string) and the fewest, on one torch thread; and,
served (the serving tests' in-process stack: three workers, two pipelines, the demo checkpoint), the
time to the first token of ``json_object`` requests sent one at a time (a last stage compiles on its
first one), and 8 concurrent greedy requests with and without the test schema: mean time per output
token.

    python scripts/bench_structured.py [--deep] [--no-write]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

HEADING = "## Structured output (`scripts/bench_structured.py`)"


def _bpe32k(path: Path) -> Path:
    import sysconfig

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(stdlib.rglob("*.py"))[:3000]

    def texts():
        for f in files:
            try:
                yield f.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                pass
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=32000, special_tokens=["<unk>", "<s>", "</s>"],
                                  show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts(), trainer)
    tok.save(str(path / "tokenizer.json"))
    return path


def _formats(deep: bool) -> dict[str, str]:
    from outlines_core.json_schema import build_regex_from_schema

    from helix.server.structured import WHITESPACE, guided_regex
    from tests.helix.server.test_structured_output import FORMAT
    out = {"test schema": guided_regex(FORMAT), "json_object": guided_regex({"type": "json_object"})}
    if deep:
        out["outlines {type: object}"] = build_regex_from_schema('{"type": "object"}', WHITESPACE)
    return out


def _mask_cost(vocabulary, regex: str) -> tuple[float, float, int, int]:
    """ms per step of masking 8 rows of [8, 32000]: (most allowed, fewest allowed, their counts)."""
    import torch
    from outlines_core import Index

    from helix.net.sampling import SamplingParams
    from worker.guided import Guide, GuideIndex
    from worker.sampling import SamplingState, _constrained
    torch.set_num_threads(1)   # as served workers run here; with 2 threads on this loaded 2-core
    # machine the same mask took 5-140 ms from run to run (the pool's threads wait for cores)
    gi = GuideIndex(Index(regex, vocabulary), (2,), 2, 32000, torch.device("cpu"))
    states = list(gi.index.get_transitions())
    sizes = {s: len(gi.allowed_ids(s)) for s in states}
    out = []
    for s in (max(sizes, key=sizes.get), min(sizes, key=sizes.get)):
        rows = []
        for _ in range(8):
            g = Guide(gi)
            g.state = s
            rows.append(SamplingState(SamplingParams(), guide=g))
        logits = torch.randn(8, 32000)
        _constrained(logits.clone(), rows)   # warm the per-state cache
        t0 = time.perf_counter()
        for _ in range(50):
            _constrained(logits.clone(), rows)
        out.append((time.perf_counter() - t0) / 50 * 1e3)
    return out[0], out[1], max(sizes.values()), min(sizes.values())


def _first(handle) -> tuple[float, list[int]]:
    """(seconds to the first token, all tokens) of one coordinator request."""
    t0, first, tokens = time.perf_counter(), None, []
    for ev in handle.events(timeout_s=120):
        if hasattr(ev, "token_ids"):
            first = first or time.perf_counter() - t0
            tokens.extend(ev.token_ids)
    return first, tokens


def _served(ckpt: Path) -> list[str]:
    """Lines on the live stack: json_object TTFT one at a time; per-token time, guided vs free."""
    import statistics

    from helix.net.sampling import SamplingParams
    from helix.server.structured import guided_regex
    from tests.builders.stack import local_stack
    from tests.builders.traffic import submit_all
    from tests.helix.server.test_structured_output import FORMAT
    obj = SamplingParams(temperature=0.0, max_tokens=200, guided_regex=guided_regex({"type": "json_object"}))
    schema = SamplingParams(temperature=0.0, max_tokens=300, guided_regex=guided_regex(FORMAT))
    prompts = [[1, 30 + k, 31, 32 + k] for k in range(8)]
    lines = []
    with local_stack(ckpt) as stack:
        coord = stack.coordinator
        ttft = [_first(coord.submit(prompts[k % 8], obj))[0] for k in range(8)]
        lines.append(f"json_object, one request at a time: time to first token {ttft[0] * 1e3:.0f} ms "
                     f"and {ttft[1] * 1e3:.0f} ms for the first two (a last stage compiles on its first "
                     f"json_object request), median {statistics.median(ttft[2:]) * 1e3:.0f} ms for the "
                     f"6 after.")
        for name, params in (("test schema", schema),
                             ("free", SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True))):
            t0 = time.perf_counter()
            results, threads = submit_all(coord, prompts, 8, params)
            for t in threads:
                t.join(timeout=120)
            wall = time.perf_counter() - t0
            n = sum(len(tokens) for tokens, _ in results)
            lines.append(f"8 concurrent greedy, {name}: {n} tokens in {wall:.2f} s, "
                         f"{wall / n * 8 * 1e3:.1f} ms per token per request.")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--deep", action="store_true", help="also outlines' own {type: object} (slow)")
    ap.add_argument("--no-write", action="store_true", help="do not write BENCHMARKS.md")
    args = ap.parse_args()
    from outlines_core import Index, Vocabulary

    from helix.commands.demo_checkpoint import write_tiny_checkpoint
    from worker.guided import token_bytes_map
    load0 = os.getloadavg()[0]
    demo = Path(tempfile.mkdtemp(prefix="helix-bench-structured-demo-"))
    write_tiny_checkpoint(demo)
    t0 = time.perf_counter()
    big = _bpe32k(Path(tempfile.mkdtemp(prefix="helix-bench-structured-bpe32k-")))
    print(f"trained bpe32k in {time.perf_counter() - t0:.0f} s", flush=True)
    formats = _formats(args.deep)
    rows, vocabularies = [], {}
    for name, path, vocab_size in (("demo", demo, 512), ("bpe32k", big, 32000)):
        t0 = time.perf_counter()
        tokens = token_bytes_map(path, vocab_size, (2,))
        vocabularies[name] = Vocabulary(2, tokens)
        vocab_s = time.perf_counter() - t0
        for fmt, regex in formats.items():
            t0 = time.perf_counter()
            index = Index(regex, vocabularies[name])
            dt = time.perf_counter() - t0
            n_states = len(index.get_transitions())
            rows.append((name, f"{sum(map(len, tokens.values())):,}", f"{vocab_s:.2f}", fmt,
                         f"{len(regex):,}", f"{n_states:,}", f"{dt:.2f}"))
            print(" | ".join(rows[-1]), f"(load {os.getloadavg()[0]:.1f})", flush=True)
    most, fewest, n_most, n_fewest = _mask_cost(vocabularies["bpe32k"], formats["test schema"])
    head = ("| tokenizer | tokens | vocabulary (s) | format | regex (chars) | automaton states | "
            "compile (s) |")
    table = "\n".join([head, "|" + "---|" * 7] + ["| " + " | ".join(r) + " |" for r in rows])
    mask = (f"Mask of 8 guided rows of [8, 32000] logits (bpe32k, test schema, one torch thread): "
            f"{most:.2f} ms a step "
            f"with {n_most:,} tokens allowed per row, {fewest:.2f} ms with {n_fewest}.")
    served = _served(demo)
    print(table, mask, *served, sep="\n")
    if not args.no_write:
        from benchdoc import write_section  # scripts/ is this script's import path
        write_section("bench_structured", f"outlines-core {_version()}; one compile each, on one thread."
                      f"\n\n{table}\n\n{mask}\n\n" + "".join(f"- {line}\n" for line in served),
                      heading=HEADING, command=f"python scripts/bench_structured.py{' --deep' if args.deep else ''}",
                      load0=load0)


def _version() -> str:
    from importlib.metadata import version
    return version("outlines-core")


if __name__ == "__main__":
    main()
