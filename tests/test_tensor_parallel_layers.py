"""Per-layer checks on 2 real ranks: each tensor-parallel layer gives the outputs and gradients of
its dense counterpart (a shard of them), with and without sequence parallelism.

Tolerance: torch.testing's fp32 defaults (rtol 1.3e-6, atol 1e-5). The sharded computations sum the
same products in another grouping (a row-parallel output is two half-length dot products added by the
all-reduce), which changes only the last bits.
"""

import torch
import torch.nn.functional as F
from torch.testing import assert_close

from tests.distributed import make_comm, run_ranks

B, S, H, O, V = 2, 4, 8, 12, 16


def _layers_worker(rank: int, world: int) -> None:
    from workbench.model.gpt import init_tensor
    from workbench.parallel.tensor_parallel import (
        ColumnParallelLinear,
        RowParallelLinear,
        VocabParallelEmbedding,
        vocab_parallel_cross_entropy,
    )
    from workbench.parallel.tp_communications import TPContext

    comm = make_comm(rank, world, tp=world)
    g = torch.Generator().manual_seed(0)
    x_full = torch.randn(B, S, H, generator=g)
    r_col = torch.randn(B, S, O, generator=g)
    sl = slice(rank * S // world, (rank + 1) * S // world)

    def dense(i, o, name):
        lin = torch.nn.Linear(i, o)
        with torch.no_grad():
            lin.weight.copy_(init_tensor(f"{name}.weight", (o, i), 0))
            lin.bias.copy_(torch.randn(o, generator=torch.Generator().manual_seed(5)))
        return lin

    def shard_into(layer, lin):
        with torch.no_grad():
            layer.weight.copy_(layer.shard_param("weight", lin.weight))
            layer.bias.copy_(layer.shard_param("bias", lin.bias))

    for sp in (False, True):
        tp = TPContext(comm=comm, rank=rank, size=world, sequence_parallel=sp)
        # column-parallel, with qkv-style sections (three equal blocks, each split over the tp ranks)
        lin = dense(H, O, "col")
        col = ColumnParallelLinear(H, O, tp, "col", sections=(O // 3,) * 3)
        shard_into(col, lin)
        xd = x_full.clone().requires_grad_()
        (lin(xd) * r_col).sum().backward()
        xt = (x_full[:, sl] if sp else x_full).clone().requires_grad_()
        out = col(xt)
        cols = col.shard_param("weight", torch.arange(O).float().unsqueeze(1)).squeeze(1).long()
        assert_close(out, lin(x_full)[..., cols].detach())
        (out * r_col[..., cols]).sum().backward()
        assert_close(xt.grad, xd.grad[:, sl] if sp else xd.grad)
        assert_close(col.weight.grad, lin.weight.grad[cols])
        assert_close(col.bias.grad, lin.bias.grad[cols])

        # row-parallel: input split on its last dim
        lin = dense(O, H, "row")
        row = RowParallelLinear(O, H, tp, "row")
        shard_into(row, lin)
        x2 = torch.randn(B, S, O, generator=torch.Generator().manual_seed(3))
        r_row = torch.randn(B, S, H, generator=torch.Generator().manual_seed(4))
        xd = x2.clone().requires_grad_()
        (lin(xd) * r_row).sum().backward()
        per = O // world
        xt = x2[..., rank * per : (rank + 1) * per].clone().requires_grad_()
        out = row(xt)
        want = lin(x2).detach()
        assert_close(out, want[:, sl] if sp else want)
        (out * (r_row[:, sl] if sp else r_row)).sum().backward()
        assert_close(xt.grad, xd.grad[..., rank * per : (rank + 1) * per])
        assert_close(row.weight.grad, lin.weight.grad[:, rank * per : (rank + 1) * per])
        # with sequence parallelism the bias gradient is partial until TensorParallelGrads
        if not sp:
            assert_close(row.bias.grad, lin.bias.grad)

        # vocabulary-parallel embedding
        emb_w = init_tensor("wte.weight", (V, H), 0)
        emb = VocabParallelEmbedding(V, H, tp, "wte")
        with torch.no_grad():
            emb.weight.copy_(emb.shard_param("weight", emb_w))
        idx = torch.randint(0, V, (B, S), generator=torch.Generator().manual_seed(6))
        want = F.embedding(idx, emb_w)
        out = emb(idx)
        assert_close(out, want[:, sl] if sp else want)

    # vocabulary-parallel cross-entropy equals the dense one, values and gradients
    tp = TPContext(comm=comm, rank=rank, size=world)
    logits = torch.randn(B, S, V, generator=torch.Generator().manual_seed(7))
    targets = torch.randint(0, V, (B, S), generator=torch.Generator().manual_seed(8))
    ld = logits.clone().requires_grad_()
    dense_loss = F.cross_entropy(ld.view(-1, V), targets.view(-1))
    dense_loss.backward()
    per = V // world
    lt = logits[..., rank * per : (rank + 1) * per].clone().requires_grad_()
    loss = vocab_parallel_cross_entropy(lt, targets, tp)
    assert_close(loss, dense_loss.detach())
    loss.backward()
    assert_close(lt.grad, ld.grad[..., rank * per : (rank + 1) * per])
    # the full logits were never gathered: only (b·s)-sized all-reduces ran for the loss
    loss_ops = [e for e in comm.recorder.events if e.get("args", {}).get("layer") == "loss"]
    assert loss_ops and all(e["args"]["bytes"] == B * S * 4 for e in loss_ops)


def test_tensor_parallel_layers_equal_dense_layers():
    run_ranks(_layers_worker, 2)
