"""Strict mode checks under gloo what NCCL will demand of every tensor handed to communication — on the
rank's device, dense, contiguous, a dtype NCCL has — and names the call site; it is on in the whole
test suite (tests/conftest.py, and the root conftest.py for the notebooks), in every rank it launches."""

import os

import pytest
import torch

from tests.distributed import make_comm, run_ranks
from workbench.comm import strict
from workbench.comm.strict import StrictCommError

HERE = os.path.basename(__file__)


def _violations(rank, world):
    comm = make_comm(rank, world, dp=2)
    assert comm.strict, "the ranks of the test suite run strict"
    where = rf"the tensor of all_reduce at .*{HERE}:\d+ in _violations: .*not contiguous"
    with pytest.raises(StrictCommError, match=where):
        comm.all_reduce(torch.ones(4, 3).t(), "dp")
    with pytest.raises(StrictCommError, match="layout is torch.sparse_coo"):
        comm.broadcast(torch.ones(3).to_sparse(), 0, "dp")
    if hasattr(torch, "uint16"):
        with pytest.raises(StrictCommError, match="dtype torch.uint16 is not one NCCL has"):
            comm.all_reduce(torch.ones(3, dtype=torch.uint16), "dp")
    with pytest.raises(
        StrictCommError, match=r"tensor 1 of p2p batch \(send, send x\) .*not contiguous"
    ):
        comm.batch_isend_irecv(
            [
                ("send", torch.ones(2), 1 - rank, None),
                ("send", torch.ones(3, 2).t(), 1 - rank, "x"),
            ],
            "dp",
        )
    # a CUDA rank: a CPU tensor is refused even without strict mode
    comm.device = torch.device("cuda", 0)
    comm.strict = False
    with pytest.raises(StrictCommError, match="it is on cpu, the rank's device is cuda:0"):
        comm.all_reduce(torch.ones(2), "dp")
    comm.device, comm.strict = torch.device("cpu"), True
    ok = torch.ones(2)
    comm.all_reduce(ok, "dp")  # nothing was posted before: the group is still in step
    assert torch.equal(ok, torch.full((2,), 2.0))


def test_strict_mode_names_what_nccl_would_refuse_and_where():
    run_ranks(_violations, 2)


def test_strict_mode_is_on_for_the_suite_and_its_launches(launched):
    assert strict.enabled()
    run = launched(dp=2)
    assert all(t["workbench"]["strict_comm"] for t in run.traces)
