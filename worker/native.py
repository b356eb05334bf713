"""The CPU engine's float32 kernels (``worker/cpu_kernels.c``), built on first use and called
through ctypes: paged attention, SiLU-mul, rotary + KV store.

PyTorch has no CPU attention that reads a paged cache through block tables: the portable way is to
gather every context into a contiguous buffer and run SDPA over it, which moves each KV byte three
times (read, write, read again). The attention kernel reads each byte once per tile of query rows.
The other two replace chains of elementwise ops (five for the rotary, two KV writes; two for
SiLU-mul), each a pass over memory. The source is plain C with no Python or PyTorch headers, so
building it takes a fraction of a second with the system compiler (``$CC``, else ``cc``); the
shared library is kept in ``$HELIX_CACHE_DIR/kernels`` (default ``~/.cache/helix/kernels``) under a
name that hashes the source, the flags, the compiler and the machine. Without a compiler (or if
the build fails) :func:`load` returns None once, with a warning, and the engine keeps the PyTorch
path (``gather``).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

log = logging.getLogger("helix.native")

SOURCE = Path(__file__).with_name("cpu_kernels.c")
# -ffast-math's reassociation (vectorized reductions) without -ffast-math itself: linked into a
# shared object, -ffast-math brings crtfastmath.o, whose constructor turns on flush-to-zero for the
# whole process that loads it (subnormal floats become 0 in every later computation).
FLAGS = ("-O3", "-march=native", "-fno-math-errno", "-fno-trapping-math", "-fassociative-math",
         "-fno-signed-zeros", "-freciprocal-math", "-fopenmp-simd", "-shared", "-fPIC", "-std=c11")

_lock = threading.Lock()
_loaded: dict[str, "NativeKernels | None"] = {}
calls = 0
"""Kernel calls so far in this process, all three kernels (the operation-count tests read it)."""


def cache_dir() -> Path:
    root = os.environ.get("HELIX_CACHE_DIR") or Path.home() / ".cache" / "helix"
    return Path(root) / "kernels"


def _compiler() -> str | None:
    return shutil.which(os.environ.get("CC", "cc"))


def _build(cc: str) -> Path:
    source = SOURCE.read_bytes()
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    key = hashlib.sha256(b"\0".join([source, " ".join(FLAGS).encode(), version.encode(),
                                     platform.machine().encode(), _cpu_flags().encode()])).hexdigest()[:16]
    target = cache_dir() / f"cpu_kernels-{key}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        built = Path(tmp) / target.name
        proc = subprocess.run([cc, *FLAGS, str(SOURCE), "-o", str(built), "-lm"], capture_output=True,
                              text=True, timeout=120)
        if proc.returncode != 0:
            raise RuntimeError(f"{cc} failed: {proc.stderr.strip()[-500:]}")
        os.replace(built, target)   # atomic: a concurrent build of the same key is harmless
    return target


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor()


class NativeKernels:
    """The loaded kernels."""

    def __init__(self, path: Path) -> None:
        self.path = path
        lib = ctypes.CDLL(str(path))
        ptr, i64 = ctypes.c_void_p, ctypes.c_int64
        self._attention = lib.helix_paged_attention_f32
        self._attention.argtypes = [ptr] * 8 + [i64] * 11 + [ctypes.c_float]
        self._attention.restype = ctypes.c_int
        self._silu_mul = lib.helix_silu_mul_f32
        self._silu_mul.argtypes = [ptr, ptr, i64, i64, i64]
        self._silu_mul.restype = None
        self._rotary = lib.helix_rotary_store_f32
        self._rotary.argtypes = [ptr] * 7 + [i64] * 6
        self._rotary.restype = None

    def paged_attention(self, out: torch.Tensor, q: torch.Tensor, k_cache: torch.Tensor,
                        v_cache: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor,
                        q_starts: torch.Tensor, q_lens: torch.Tensor, block_size: int,
                        scale: float) -> None:
        """As :func:`worker.triton_ops.paged_attention` (float32 CPU tensors, int32 metadata)."""
        global calls
        heads, head_dim = q.shape[1], q.shape[2]
        for t in (out, q, k_cache, v_cache):
            assert t.dtype == torch.float32 and t.device.type == "cpu" and t.stride(-1) == 1
        assert k_cache.stride(1) == head_dim and v_cache.stride() == k_cache.stride()
        for t in (block_tables, seq_lens, q_starts, q_lens):
            assert t.dtype == torch.int32 and t.is_contiguous()
        if seq_lens.numel() == 0:
            return
        calls += 1
        rc = self._attention(out.data_ptr(), q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(),
                             block_tables.data_ptr(), seq_lens.data_ptr(), q_starts.data_ptr(),
                             q_lens.data_ptr(), seq_lens.numel(), block_tables.shape[1], heads,
                             k_cache.shape[0], head_dim, block_size, q.stride(0), q.stride(1),
                             out.stride(0), out.stride(1), k_cache.stride(0), scale)
        if rc != 0:
            raise MemoryError("paged attention: out of memory for its score buffer")

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """``silu(gate) * up`` of ``[n, 2 * inter]`` (gate first, rows contiguous) -> ``[n, inter]``."""
        global calls
        n, two_inter = gate_up.shape
        assert gate_up.dtype == torch.float32 and gate_up.stride(-1) == 1
        out = torch.empty((n, two_inter // 2), dtype=torch.float32)
        if n:
            calls += 1
            self._silu_mul(out.data_ptr(), gate_up.data_ptr(), n, two_inter // 2, gate_up.stride(0))
        return out

    def rotary_and_store(self, qkv: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor,
                         sin: torch.Tensor, slots: torch.Tensor, k_cache: torch.Tensor,
                         v_cache: torch.Tensor, heads: int, kv_heads: int) -> None:
        """As :func:`worker.triton_ops.rotary_and_store` (float32 CPU; positions and slots int64)."""
        global calls
        n = qkv.shape[0]
        head_dim = k_cache.shape[-1]
        assert qkv.dtype == torch.float32 and qkv.stride(-1) == 1
        assert cos.is_contiguous() and sin.is_contiguous() and k_cache.stride(1) == head_dim
        assert positions.dtype == torch.long and slots.dtype == torch.long
        assert positions.is_contiguous() and slots.is_contiguous()
        if n:
            calls += 1
            self._rotary(qkv.data_ptr(), positions.data_ptr(), slots.data_ptr(), cos.data_ptr(),
                         sin.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), n, heads, kv_heads,
                         head_dim, qkv.stride(0), k_cache.stride(0))


def load() -> "NativeKernels | None":
    """The kernels, built if needed; None (warned once) when it cannot be built here."""
    with _lock:
        if "lib" not in _loaded:
            _loaded["lib"] = _try_load()
        return _loaded["lib"]


def _try_load() -> "NativeKernels | None":
    cc = _compiler()
    if cc is None:
        log.warning("no C compiler (set CC or install cc): CPU attention gathers each context "
                    "into a contiguous buffer instead of reading the paged cache in place")
        return None
    try:
        return NativeKernels(_build(cc))
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        log.warning("could not build the CPU kernels (%s): CPU attention gathers each context "
                    "instead", exc)
        return None
