"""Which GPUs this machine has: every case of the GPU suite says how many it needs and skips with fewer
(on a machine without CUDA, all of them: make test-gpu then reports them skipped and passes)."""

import pytest
import torch

#: CUDA devices this machine shows; every case says how many it needs and skips with fewer
GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0


def needs(gpus: int) -> pytest.MarkDecorator:
    return pytest.mark.skipif(
        GPUS < gpus, reason=f"needs {gpus} CUDA GPU(s); this machine has {GPUS}"
    )
