"""Device helpers shared by the training loop and the pipeline executor."""

from __future__ import annotations

import torch


def sync_compute(device: torch.device) -> None:
    """On a GPU, wait for the compute stream only, so that a span covers the kernels it launched but
    not the communication streams (whose overlap the trace is there to show). Nothing on a CPU."""
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()
