"""Hardware catalog: what each GPU kind can do, with the source of every figure.

Peak figures are the vendor's dense (no 2:4 sparsity) FP16/BF16 tensor-core numbers with FP32
accumulate where the vendor distinguishes, HBM/GDDR bandwidth, and memory size in GiB (GPU memory
is binary: an "A100 40GB" has 40 GiB). ``compute_efficiency`` and ``memory_efficiency`` are the
fractions of peak that LLM layers really reach; they were calibrated against the measured LLaMA-30B
layer profiles in ``shared/data/profiles`` for the kinds that have one (see ``helix.core.calibration``
and BENCHMARKS.md, *Cost model*; the memory factors were refitted when decode attention became a
kernel of its own, added to the GEMMs, with the profiles' decode points at 832 tokens of context),
and default to :data:`DEFAULT_COMPUTE_EFFICIENCY` /
:data:`DEFAULT_MEMORY_EFFICIENCY` for the others.

``interconnect_bytes_per_s`` is the effective GPU-to-GPU bandwidth inside one node for tensor
parallel all-reduces: NVLink for SXM parts, PCIe (often through the host, no peer-to-peer on cloud
L4/T4 VMs) for the rest. The L4 and T4 figures are effective all-reduce bus bandwidths fitted to
the measured 2- and 4-GPU profiles (l4x2, t4x2, t4x4), well below PCIe's nominal 16/32 GB/s, as is
usual without peer-to-peer; the other PCIe cards reuse a like figure (8 GB/s), unmeasured.
"""

from __future__ import annotations

from dataclasses import dataclass

GiB = 2.0**30

#: Fraction of peak FP16 tensor throughput reached by a transformer layer's GEMMs (vLLM, fp16).
DEFAULT_COMPUTE_EFFICIENCY = 0.55
#: Fraction of peak memory bandwidth reached by weight + KV streaming in decode.
DEFAULT_MEMORY_EFFICIENCY = 0.75
#: Fixed cost per layer per step (kernel launches, norms, rotary, sampling glue), seconds.
DEFAULT_LAYER_OVERHEAD_S = 60e-6
#: Cost of a KV byte that a query head re-reads after another head of its GQA group brought it on
#: chip, relative to a first read from DRAM, in vLLM's PagedAttention decode kernel (one thread
#: block per query head); derived from a published A100 timing in ``helix.core.costmodel``'s docstring.
DEFAULT_KV_REREAD_COST = 0.35


@dataclass(frozen=True)
class GpuKind:
    """One accelerator model. Multi-GPU nodes multiply these by their GPU count."""

    name: str
    fp16_flops: float
    """Dense FP16/BF16 tensor FLOP/s (no sparsity)."""
    memory_bandwidth_bytes_per_s: float
    vram_bytes: float
    interconnect_bytes_per_s: float
    """Effective GPU-to-GPU all-reduce bandwidth inside a node (tensor parallel)."""
    source: str
    compute_efficiency: float = DEFAULT_COMPUTE_EFFICIENCY
    memory_efficiency: float = DEFAULT_MEMORY_EFFICIENCY
    layer_overhead_s: float = DEFAULT_LAYER_OVERHEAD_S
    allreduce_latency_s: float = 15e-6
    """Latency of one ring step of an all-reduce (launch + sync)."""
    kv_reread_cost: float = DEFAULT_KV_REREAD_COST
    """Decode attention: cost of a GQA group's repeated KV read relative to the first (0: the
    kernel reads each KV head once for its whole group)."""


_CATALOG: tuple[GpuKind, ...] = (
    # NVIDIA A100 datasheet (SXM4): 312 TFLOPS FP16 tensor dense, 1,555 GB/s HBM2 (40GB) /
    # 2,039 GB/s HBM2e (80GB), NVLink 3 600 GB/s bidirectional (300 GB/s each way).
    GpuKind("A100-40G", 312e12, 1555e9, 40 * GiB, 240e9,
            "NVIDIA A100 Tensor Core GPU datasheet (SXM4 40GB)",
            compute_efficiency=0.78, memory_efficiency=0.83),
    GpuKind("A100-80G", 312e12, 2039e9, 80 * GiB, 240e9,
            "NVIDIA A100 Tensor Core GPU datasheet (SXM4 80GB)",
            compute_efficiency=0.78, memory_efficiency=0.83),
    # NVIDIA H100 datasheet (SXM5): 989 TFLOPS FP16 tensor dense, 3.35 TB/s HBM3, NVLink 4 900 GB/s.
    GpuKind("H100-80G", 989e12, 3350e9, 80 * GiB, 360e9,
            "NVIDIA H100 Tensor Core GPU datasheet (SXM5 80GB)"),
    # NVIDIA L4 datasheet: 242 TFLOPS FP16 tensor *with sparsity* -> 121 dense; 300 GB/s GDDR6,
    # 24 GB; PCIe Gen4 x16, 72 W (power-capped: sustained GEMM rate is far below peak).
    GpuKind("L4", 121e12, 300e9, 24 * GiB, 4e9,
            "NVIDIA L4 Tensor Core GPU datasheet",
            compute_efficiency=0.42, memory_efficiency=0.78),
    # NVIDIA T4 datasheet: 65 TFLOPS FP16 tensor (mixed precision), 320 GB/s GDDR6, 16 GB, PCIe Gen3.
    GpuKind("T4", 65e12, 320e9, 16 * GiB, 5e9,
            "NVIDIA T4 Tensor Core GPU datasheet",
            compute_efficiency=0.40, memory_efficiency=0.70, allreduce_latency_s=30e-6),
    # NVIDIA V100 datasheet (SXM2): 125 TFLOPS tensor, 900 GB/s HBM2, NVLink 2 300 GB/s.
    GpuKind("V100-16G", 125e12, 900e9, 16 * GiB, 120e9,
            "NVIDIA Tesla V100 datasheet (SXM2 16GB)",
            compute_efficiency=0.66, memory_efficiency=0.73),
    GpuKind("V100-32G", 125e12, 900e9, 32 * GiB, 120e9,
            "NVIDIA Tesla V100 datasheet (SXM2 32GB)",
            compute_efficiency=0.66, memory_efficiency=0.73),
    # NVIDIA A10G (AWS G5): 70 TFLOPS FP16 tensor dense as AWS/NVIDIA list it for the G5
    # instances (the A10 retail card lists 125), 600 GB/s GDDR6, 24 GB, PCIe Gen4.
    GpuKind("A10G", 70e12, 600e9, 24 * GiB, 8e9,
            "NVIDIA A10G as specified for AWS EC2 G5 instances"),
    # NVIDIA Ampere GA102 whitepaper, RTX 3090: 71 TFLOPS FP16 tensor with FP32 accumulate
    # (142 with FP16 accumulate), 936 GB/s GDDR6X, 24 GB.
    GpuKind("RTX3090", 71e12, 936e9, 24 * GiB, 8e9,
            "NVIDIA Ampere GA102 GPU architecture whitepaper (RTX 3090)"),
    # NVIDIA Ada Lovelace whitepaper, RTX 4090: 165.2 TFLOPS FP16 tensor with FP32 accumulate,
    # 1,008 GB/s GDDR6X, 24 GB.
    GpuKind("RTX4090", 165.2e12, 1008e9, 24 * GiB, 8e9,
            "NVIDIA Ada Lovelace GPU architecture whitepaper (RTX 4090)"),
    # A CPU "node" for local demos and tests: two cores of a recent x86 server with AVX2 FMA
    # (~2 x 3 GHz x 32 FLOP/cycle fp32 ~ 200 GFLOP/s peak), ~10 GB/s of DRAM bandwidth per
    # process; its memory is the node's `memory` field in the spec (default 4 GiB here).
    GpuKind("CPU", 200e9, 10e9, 4 * GiB, 10e9,
            "two x86-64 cores, AVX2 FMA; estimate, not measured",
            compute_efficiency=0.25, memory_efficiency=0.5, layer_overhead_s=200e-6,
            kv_reread_cost=0.0),  # helix's engine attends per KV head, its group at once
)

GPU_CATALOG: dict[str, GpuKind] = {g.name: g for g in _CATALOG}

#: Other spellings people write in cluster files, mapped to catalog names.
GPU_ALIASES: dict[str, str] = {
    "A100": "A100-40G", "A100-40GB": "A100-40G", "A100-80GB": "A100-80G",
    "H100": "H100-80G", "H100-80GB": "H100-80G",
    "V100": "V100-16G", "V100-16GB": "V100-16G", "V100-32GB": "V100-32G",
    "RTX-3090": "RTX3090", "3090": "RTX3090", "RTX-4090": "RTX4090", "4090": "RTX4090",
}


def lookup_gpu(name: str) -> GpuKind | None:
    """Catalog entry for a name or alias (case-insensitive), or None."""
    key = name.strip()
    folded = {k.lower(): v for k, v in GPU_CATALOG.items()}
    aliases = {k.lower(): v for k, v in GPU_ALIASES.items()}
    if key.lower() in folded:
        return folded[key.lower()]
    if key.lower() in aliases:
        return GPU_CATALOG[aliases[key.lower()]]
    return None


def known_gpu_names() -> str:
    return ", ".join(GPU_CATALOG)
