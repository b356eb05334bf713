"""Structured output on the last stage: the token automaton of a request's ``guided_regex``.

The server turns a ``response_format`` into a regex (``helix.server.structured``); here
``outlines_core`` compiles it, over this checkpoint's vocabulary (``tokenizer.json``, each token as
the raw bytes it stands for, :mod:`helix.core.tokens`), into an ``Index``: per automaton state, the tokens
that keep the reply a prefix of some match and the state each leads to. The sampler keeps only those
tokens (:class:`Guide` per request); a state where the match is complete also allows the EOS tokens,
and one where nothing but EOS could follow ends the request (finish reason ``stop``) without
sampling it. Added (special) tokens and ids past the tokenizer's vocabulary are never allowed.

Compiling can take seconds (a free-form ``{"type": "object"}`` does even over the demo's 297
tokens: BENCHMARKS.md, *Structured output*), so :class:`GuideCompiler` runs it on threads of its own
(``outlines_core`` releases the GIL while it builds; measured: a thread beside it keeps running) and
caches the result per regex (each compile runs in a child process, killed past
:data:`COMPILE_TIMEOUT_S` or :data:`COMPILE_MEMORY_BYTES`: some ordinary schemas never finish);
the engine holds a request's inputs back until its automaton is ready (``SliceEngine`` admits it
then), so the step loop never waits on a compile.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import torch

from helix.core.errors import HelixUserError
from helix.core.tokens import piece_bytes, tokenizer_kind

_CACHE_SIZE = 16
"""Compiled regexes kept per engine."""
_MASK_BYTES = 8 * 2**20
"""Token masks (one ``vocab_size``-byte bool per automaton state visited lately) kept per compiled
regex, on the engine's device: at most 16 x 8 MiB per engine (512 states at a 16k vocabulary,
64 at 128k)."""

COMPILE_TIMEOUT_S = 60.0
"""Seconds one regex may take to compile (in a child process, :func:`_compile_bounded`): past it
the request fails with a 'did not compile' message instead of holding a compile thread forever."""
COMPILE_MEMORY_BYTES = 8 * 2**30
"""Address space one compile may map (the child's ``RLIMIT_AS``)."""


def token_bytes_map(ckpt_dir: str | Path, vocab_size: int,
                    excluded: Sequence[int] = ()) -> dict[bytes, list[int]]:
    """Raw bytes -> token ids of the checkpoint's tokenizer: ids below ``vocab_size`` (the model's
    logits), without added (special) tokens, ``excluded`` ids and tokens that stand for no bytes."""
    from tokenizers import Tokenizer
    path = Path(ckpt_dir) / "tokenizer.json"
    if not path.is_file():
        raise HelixUserError(f"structured output needs the checkpoint's tokenizer.json on the last "
                             f"stage; {str(path)!r} does not exist")
    tok = Tokenizer.from_file(str(path))
    kind = tokenizer_kind(json.loads(tok.to_str()))
    skip = {*tok.get_added_tokens_decoder(), *excluded}
    out: dict[bytes, list[int]] = {}
    for piece, token_id in tok.get_vocab(with_added_tokens=False).items():
        if token_id < vocab_size and token_id not in skip:
            raw = piece_bytes(piece, kind)
            if raw:
                out.setdefault(raw, []).append(token_id)
    return out


class GuideIndex:
    """One compiled regex: an ``outlines_core.Index`` and, per visited state, the mask of the tokens
    it bans (the states visited last, within :data:`_MASK_BYTES`)."""

    def __init__(self, index, eos_token_ids: Sequence[int], index_eos: int, vocab_size: int,
                 device: torch.device) -> None:
        self.index = index
        self.eos_token_ids = tuple(eos_token_ids)
        self._index_eos = index_eos   # the id outlines' Index uses for "the match may end here"
        self.vocab_size = vocab_size
        self.device = device
        self._banned: OrderedDict[int, torch.Tensor] = OrderedDict()
        self._masks_kept = max(8, _MASK_BYTES // max(1, vocab_size))
        self._only_end: dict[int, bool] = {}   # final states only: few
        self._lock = threading.Lock()

    @property
    def initial_state(self) -> int:
        return self.index.get_initial_state()

    def allowed_ids(self, state: int) -> list[int]:
        """Token ids allowed in ``state``, sorted; EOS ids where the match is complete."""
        raw = self.index.get_allowed_tokens(state) or []
        keep = [t for t in raw if t != self._index_eos]
        if len(keep) != len(raw):
            keep += self.eos_token_ids
        return sorted({t for t in keep if t < self.vocab_size})

    def banned(self, state: int) -> torch.Tensor:
        """``[vocab_size]`` bool on the engine's device: True for every token ``state`` does not
        allow. (A cached mask and ``masked_fill_`` cost 0.1 ms a row at 32k tokens; indexing the
        allowed ids each step cost 0.5 ms and more.)"""
        with self._lock:
            mask = self._banned.get(state)
            if mask is None:
                mask = torch.ones(self.vocab_size, dtype=torch.bool)
                mask[self.allowed_ids(state)] = False
                mask = self._banned[state] = mask.to(self.device)
                while len(self._banned) > self._masks_kept:
                    self._banned.popitem(last=False)
            else:
                self._banned.move_to_end(state)
            return mask

    def next_state(self, state: int, token_id: int) -> int | None:
        return self.index.get_next_state(state, token_id)

    def is_final(self, state: int) -> bool:
        return self.index.is_final_state(state)

    def only_end(self, state: int) -> bool:
        """True when the match is complete and no token could extend it."""
        if not self.is_final(state):
            return False
        with self._lock:
            done = self._only_end.get(state)
        if done is None:
            done = all(t == self._index_eos for t in self.index.get_allowed_tokens(state) or [])
            with self._lock:
                self._only_end[state] = done
        return done


class Guide:
    """The automaton state of one request (advanced by every token it samples)."""

    def __init__(self, index: GuideIndex) -> None:
        self.index = index
        self.state = index.initial_state

    def banned(self) -> torch.Tensor:
        """``[vocab_size]`` bool: the tokens the current state does not allow."""
        return self.index.banned(self.state)

    def advance(self, token_id: int) -> None:
        """Move past ``token_id``; an EOS token ends the match and leaves the state as is.
        :class:`HelixUserError` for a token the automaton does not allow (a resumed request whose
        earlier output does not match)."""
        if token_id in self.index.eos_token_ids and self.index.is_final(self.state):
            return
        nxt = self.index.next_state(self.state, token_id)
        if nxt is None:
            raise HelixUserError(f"structured output: token {token_id} does not continue the "
                                 f"reply's format")
        self.state = nxt

    @property
    def finished(self) -> bool:
        """The reply is complete and nothing but EOS may follow: the request stops here."""
        return self.index.only_end(self.state)


class GuideCompiler:
    """Compiles regexes into :class:`GuideIndex` over one checkpoint's vocabulary on a background
    thread; results (and failures) are cached per regex."""

    def __init__(self, ckpt_dir: str | Path, eos_token_ids: Sequence[int], vocab_size: int,
                 device: torch.device | str = "cpu") -> None:
        self.ckpt_dir = ckpt_dir
        self.eos_token_ids = tuple(eos_token_ids)
        self.vocab_size = vocab_size
        self.device = torch.device(device)
        self._vocabulary = None
        self._futures: OrderedDict[str, Future] = OrderedDict()
        # Two threads: one pathological regex (outlines-core 0.2.14 took 40-47 s for an object with
        # "additionalProperties": {}) then delays the other new regexes less.
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="helix-guide")
        self.compile_timeout_s = COMPILE_TIMEOUT_S
        """Seconds a regex may take to compile before its request fails (the compile is killed)."""
        self.compile_memory_bytes = COMPILE_MEMORY_BYTES
        """Address space a compile may map before it fails."""
        self.compile_s: dict[str, float] = {}
        """Seconds each cached regex took to compile (for the log and for benchmarks)."""

    def compile(self, regex: str) -> Future:
        """A future of the :class:`GuideIndex` of ``regex`` (already done when cached)."""
        fut = self._futures.get(regex)
        if fut is None:
            fut = self._futures[regex] = self._pool.submit(self._build, regex)
            while len(self._futures) > _CACHE_SIZE:
                self._futures.popitem(last=False)
        else:
            self._futures.move_to_end(regex)
        return fut

    def _build(self, regex: str) -> GuideIndex:
        import time

        from outlines_core import Vocabulary
        if self._vocabulary is None:
            index_eos = self.eos_token_ids[0] if self.eos_token_ids else self.vocab_size
            tokens = token_bytes_map(self.ckpt_dir, self.vocab_size, self.eos_token_ids)
            self._vocabulary = (Vocabulary(index_eos, tokens), index_eos)
        vocabulary, index_eos = self._vocabulary
        t0 = time.perf_counter()
        index = _compile_bounded(regex, vocabulary, self.compile_timeout_s, self.compile_memory_bytes)
        self.compile_s[regex] = time.perf_counter() - t0
        return GuideIndex(index, self.eos_token_ids, index_eos, self.vocab_size, self.device)


# The child that compiles one regex: reads (regex, vocabulary, memory limit) pickled from stdin,
# writes ("ok", Index) or ("error", message) pickled to stdout. Only outlines_core is imported.
_CHILD = """
import pickle, resource, sys
regex, vocabulary, limit = pickle.load(sys.stdin.buffer)
hard = resource.getrlimit(resource.RLIMIT_AS)[1]   # never above a limit the host set
if hard != resource.RLIM_INFINITY:
    limit = min(limit, hard)
resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
from outlines_core import Index
try:
    out = ("ok", Index(regex, vocabulary))
except (ValueError, RuntimeError, MemoryError) as exc:
    out = ("error", str(exc))
sys.stdout.buffer.write(pickle.dumps(out))
"""


def _compile_bounded(regex: str, vocabulary, timeout_s: float, memory_bytes: int):
    """``outlines_core.Index(regex, vocabulary)`` built in a child process that is killed after
    ``timeout_s`` and may not map more than ``memory_bytes``: a compile cannot be interrupted in
    a thread, and some ordinary schemas never finish (outlines-core 0.2.14 over the demo's
    vocabulary: a string with maxLength 10 took 0.06 s, 14 took 0.9 s, 20 ran past 60 s; maxLength
    10^8 took 200 MB/s until the machine ran out of memory). The Index comes back pickled."""
    import pickle
    import subprocess
    import sys
    proc = subprocess.Popen([sys.executable, "-c", _CHILD], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = proc.communicate(pickle.dumps((regex, vocabulary, memory_bytes)), timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise HelixUserError(f"structured output: the schema's automaton did not compile within "
                             f"{timeout_s:g} s (long maxLength / minLength bounds and free-form "
                             f"objects grow it exponentially); simplify the schema") from None
    status, value = pickle.loads(out) if proc.returncode == 0 and out else ("error", None)
    if status == "ok":
        return value
    if value is None:   # killed by its memory limit (or crashed)
        last = (err.decode(errors="replace").strip().splitlines() or ["no output"])[-1]
        value = f"the compile stopped ({last[:120]}; limit {memory_bytes / 2**30:g} GiB)"
    first = " ".join(str(value).split())
    raise HelixUserError(f"structured output: the schema cannot be built over this model's "
                         f"vocabulary: {first[:240]}")

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
