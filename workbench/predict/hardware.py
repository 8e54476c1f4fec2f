"""What the estimator knows of a machine: `Hardware` (rates, links, memory, and the step-time model's
calibrated terms), the GPU presets, and the view of a machine through emulated links. No torch."""

from __future__ import annotations

from dataclasses import dataclass

from workbench.config import RunConfig
from workbench.config.links import parse_links


@dataclass(frozen=True, kw_only=True)
class Hardware:
    name: str
    peak_flops: float  # per device, for the run's precision
    memory_bytes: float  # per device
    intra_node_bw: float  # bus bandwidth within a node, bytes/s (nccl-tests' busbw)
    inter_node_bw: float  # bus bandwidth across nodes, per device, bytes/s
    latency_s: float = 10e-6  # per collective or transfer
    devices_per_node: int = 8
    # the fraction of peak a well-tuned transformer reaches (Megatron: 44–52 %)
    efficiency: float = 0.5
    usable_memory: float = 0.85  # headroom for the allocator, workspaces and the CUDA context
    step_overhead_s: float = 0.0  # fixed cost per step (launches, Python); calibrated on CPUs
    cores: int | None = None  # CPUs: ranks beyond the core count share them
    # device ↔ host (PCIe 4.0 x16 ≈ 25 GB/s each way): ZeRO-Offload's copies
    host_link_bw: float = 25e9
    # the step-time model's terms (predict/action_costs.py); calibrate() measures them on this machine
    # achieved by a Linear's matmul; None: peak_flops × efficiency
    matmul_flops: float | None = None
    # the attention core's batched matmuls; None: as matmul_flops
    attention_flops: float | None = None
    # what element-wise operators reach (HBM: A100 2.0 TB/s, H100 3.35 TB/s)
    memory_bw: float = 2.0e12
    # a layer's backward time over its forward (two matmuls per forward one)
    backward_ratio: float = 2.0
    # fixed cost of a block's forward per micro-batch (Python, kernel launches)
    layer_fwd_s: float = 0.0
    layer_bwd_s: float = 0.0
    #: embeddings and head+loss per micro-batch: (first fwd fixed, per sample, first bwd fixed, per sample,
    #: last fwd fixed, per sample, last bwd fixed, per sample); None: the head's FLOPs at matmul_flops
    stage_ends: tuple[float, ...] | None = None
    optimizer_s_per_value: float | None = None  # None: 32 bytes per value at memory_bw
    optimizer_s_per_tensor: float = 0.0
    p2p_latency_s: float | None = None  # None: latency_s
    # a pipeline action's own fixed cost beyond its layers (the executor's)
    action_fwd_s: float = 0.0
    action_bwd_s: float = 0.0
    # a pipeline rank's host time per batch of transfers it posts (between actions)
    post_gap_s: float = 0.0
    # host time to launch one asynchronous collective (DP buckets, ZeRO's gathers)
    launch_s: float = 0.0
    #: measured with n ranks running: (n, compute stretch, α of a collective, α of a pipeline transfer, the
    #: step's fixed cost); () → the stretch from `cores`, α = latency_s (studies/run_calibration.py)
    contention: tuple[tuple[float, ...], ...] = ()
    extra_latency_s: float = 0.0  # emulated links: latency every operation pays on top
    #: (n, κ): with n ranks, a blocking collective also waits κ × the work its rank did since the previous
    #: one (the ranks' jitter; run_calibration._pair_alpha); () → none
    skew: tuple[tuple[float, ...], ...] = ()
    #: the relative ± of a step time here: how much calibrate()'s own runs moved (step to step and run to run;
    #: studies/run_calibration.measured_spread); every predicted step time carries it. 0: not measured
    spread: float = 0.0


#: maximum achievable matmul FLOP/s, BF16, at the best shape (ml-engineering's MAMF finder, Bekman: A100 SXM
#: 267.9 of 312 TFLOP/s at 6912×16384×2048, H100 SXM 792.1 of 989 at 6144×17920×2816): what a GEMM can reach
MAMF_TFLOPS = {"A100": 267.9, "H100": 792.1}
#: the share of that a training step's GEMMs reach: their real shapes (tp-sharded widths, a few thousand tokens,
#: the wave and tile quantisation of those) and unfused epilogues. The one constant the GPU presets are fitted
#: with: 0.85 puts all ten rows of Megatron-LM's weak-scaling table (Narayanan et al. 2021) within ±12 % of
#: their published TFLOP/s per GPU (tests/test_published_runs.py)
SHAPE_EFFICIENCY = 0.85

A100_80GB = Hardware(
    name="A100 80GB (DGX A100)",
    peak_flops=312e12,
    memory_bytes=80e9,
    intra_node_bw=230e9,
    inter_node_bw=25e9,
    latency_s=10e-6,
    devices_per_node=8,
    matmul_flops=MAMF_TFLOPS["A100"] * 1e12 * SHAPE_EFFICIENCY,
)
H100_80GB = Hardware(
    name="H100 80GB (DGX H100)",
    peak_flops=989e12,
    memory_bytes=80e9,
    intra_node_bw=360e9,
    inter_node_bw=50e9,
    latency_s=8e-6,
    devices_per_node=8,
    host_link_bw=50e9,  # PCIe 5.0
    memory_bw=3.35e12,
    matmul_flops=MAMF_TFLOPS["H100"] * 1e12 * SHAPE_EFFICIENCY,
)

#: dense peaks from the datasheets, TFLOP/s per device: (16-bit tensor cores, plain fp32) — the figures an MFU
#: divides by. Matched against torch.cuda.get_device_name(): the longest name contained in it wins ("H200 NVL"
#: over "H200", "L40" over "L4").
DATASHEET_TFLOPS: tuple[tuple[str, float, float], ...] = (
    ("H100 PCIe", 756.0, 51.2),
    ("H100 NVL", 835.0, 60.0),
    ("H100", 989.4, 66.9),
    ("H200 NVL", 835.0, 60.0),
    ("H200", 989.4, 66.9),
    ("GH200", 989.4, 66.9),
    ("A100", 312.0, 19.5),
    ("L40S", 362.1, 91.6),
    ("L40", 181.0, 90.5),
    ("L4", 121.0, 30.3),
    ("RTX 4090", 165.2, 82.6),
)
#: the environment variable that gives another device's peak (TFLOP/s, for the run's precision)
PEAK_ENV = "PEAK_TFLOPS"


def peak_flops(
    device_name: str, precision: str = "bf16", override: str | None = None
) -> float | None:
    """The device's dense peak in FLOP/s for a run in `precision` (bf16/fp16: tensor cores; fp32: plain fp32,
    torch's default matmul precision), from its name; `override` (PEAK_TFLOPS) wins. None: an unknown device —
    its MFU asks for PEAK_TFLOPS."""
    if override:
        return float(override) * 1e12
    known = [row for row in DATASHEET_TFLOPS if row[0].lower() in device_name.lower()]
    if not known:
        return None
    _, half, single = max(known, key=lambda row: len(row[0]))
    return (single if precision == "fp32" else half) * 1e12


def with_emulated_links(hw: Hardware, config: RunConfig) -> Hardware:
    """The hardware as a run with --emulate-link sees it: each emulated link's time adds to the real one
    (1/bw' = 1/bw + 1/bw_link; every operation pays the slowest link's latency on top), machines of
    ranks_per_node ranks."""
    if config.emulate_link is None:
        return hw
    from dataclasses import replace

    links = parse_links(config.emulate_link)

    def bw(real: float, name: str) -> float:
        return (
            real if name not in links else 1 / (1 / real + 1 / (links[name].bandwidth_GBps * 1e9))
        )

    slowest = max((link.latency_us for link in links.values()), default=0.0)
    return replace(
        hw,
        name=f"{hw.name} + emulated links {config.emulate_link}",
        intra_node_bw=bw(hw.intra_node_bw, "intra"),
        inter_node_bw=bw(hw.inter_node_bw, "inter"),
        extra_latency_s=hw.extra_latency_s + slowest * 1e-6,
        devices_per_node=config.ranks_per_node or hw.devices_per_node,
    )
