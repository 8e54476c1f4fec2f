"""Before launch: will the run fit in memory? The predicted true peak of a rank (predict/formulas/run.py
`predicted_peak`: model states, the most activations held at once, the buffers, and the loss's transient at the
start of its backward) against what this machine has free:

    CPU ranks    each rank's peak plus what a process holds before it trains (`RANK_OVERHEAD`: Python, torch,
                 the process group), times the ranks on this machine, against the host's available memory
                 (MemAvailable: what can be had without swapping)
    CUDA ranks   each rank's peak plus CUDA's context (`CUDA_CONTEXT`) against the free memory of the GPU it
                 gets (one rank a GPU; the least free GPU stands for all)

A run that does not fit is refused before any process starts, naming both figures and what would fit — the
same run with ZeRO-3, with more microbatches (a smaller micro-batch), with full recomputation, or on fewer ranks —
each predicted the same way. `launch(check_memory=False)` (`--no-check-memory`) goes anyway. Without this a run
too large for the host starts, and the kernel's out-of-memory killer ends a rank a minute later with SIGKILL.
No torch: the GPUs' free memory comes from nvidia-smi.
"""

from __future__ import annotations

import subprocess

from workbench.config import ConfigError, RunConfig, ValidConfig
from workbench.predict.formulas.run import predicted_peak

#: a CPU rank's bytes before its model exists: measured ~0.23 GB resident after importing torch and workbench on
#: this project's machine; the process group, the trace recorder and the allocator's slack add to it
RANK_OVERHEAD = 0.4 * 2**30
#: what CUDA's context and cuBLAS/NCCL workspaces take on each GPU before the model
CUDA_CONTEXT = 1.0 * 2**30


def resolved(config: RunConfig, device: str, backend: str) -> dict:
    """The run's config as the formulas read it (config.json's fields this launch already knows)."""
    return {
        **config.to_dict(),
        "model": dict(config.model_config.__dict__),
        "device": device,
        "backend": backend,
    }


def rank_peak(config: RunConfig, device: str, backend: str) -> float:
    """The predicted true peak of the rank that holds the most, in bytes."""
    return predicted_peak(resolved(config, device, backend))[0]


def host_available() -> float | None:
    """The host's available memory (Linux's MemAvailable), or None where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def gpu_free() -> float | None:
    """The least free memory of this machine's GPUs (bytes), from nvidia-smi — not through torch, which would open a
    CUDA context on every GPU in the launcher, taking memory from each rank's for the whole run; None without it."""
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.free", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=20,
        )
        free = [float(line) * 2**20 for line in done.stdout.split() if line.strip()]
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    return min(free) if done.returncode == 0 and free else None


def alternatives(config: RunConfig) -> list[tuple[str, ValidConfig]]:
    """What the refusal suggests, each a valid variant of the run: ZeRO-3, a smaller micro-batch, full
    recomputation, half the data-parallel ranks."""
    out = []
    for text, change in (
        ("zero=3", {"zero": 3}),
        (f"microbatches={config.microbatches * 2}", {"microbatches": config.microbatches * 2}),
        ("recompute='full'", {"recompute": "full"}),
        (f"dp={config.dp // 2}", {"dp": config.dp // 2}),
    ):
        if all(getattr(config, k) == v for k, v in change.items()):
            continue
        try:
            out.append((text, config.replace(**change).validate()))
        except (ConfigError, ValueError, ZeroDivisionError):
            continue
    return out


def check_fits_memory(config: ValidConfig, backend: str, ranks_here: int) -> None:
    """ConfigError when the predicted peak of the `ranks_here` ranks this machine starts exceeds its free memory."""
    cuda = backend == "nccl"
    free = gpu_free() if cuda else host_available()
    if free is None:
        return
    device = "cuda" if cuda else "cpu"
    overhead, ranks = (CUDA_CONTEXT, 1) if cuda else (RANK_OVERHEAD, ranks_here)

    def need(cfg: RunConfig, n: int = ranks) -> float:
        return (rank_peak(cfg, device, backend) + overhead) * n

    needed = need(config)
    if needed <= free:
        return
    per = "on each GPU" if cuda else f"for its {ranks} rank(s) on this machine"
    fits = [
        text
        for text, cfg in alternatives(config)
        if need(
            cfg,
            ranks if cuda or cfg.dp == config.dp else ranks * cfg.world_size // config.world_size,
        )
        <= free
    ]
    suggestion = (
        f"these would fit: {', '.join(fits)}"
        if fits
        else "none of zero=3, a smaller micro-batch, "
        "recompute='full' or fewer ranks alone would fit: a smaller model or a larger machine"
    )
    raise ConfigError(
        f"the run would need about {needed / 2**30:,.1f} GiB {per} at its peak (predicted: "
        f"{rank_peak(config, device, backend) / 2**30:,.1f} GiB a rank — model states, activations and "
        f"the loss's transient — plus {overhead / 2**30:.1f} GiB a process) and "
        f"{'the GPU' if cuda else 'this machine'} has {free / 2**30:,.1f} GiB free; {suggestion} — "
        f"or launch anyway: check_memory=False (--no-check-memory)"
    )
