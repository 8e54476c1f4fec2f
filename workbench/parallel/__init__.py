"""parallel: how a model is sharded, one strategy a file — each docstring says what is sharded, which collective
runs in forward and backward, and the paper.

    data_parallel.py    DP: bucketed all-reduce overlapped with backward (and naive, one per parameter)
    zero.py, zero3.py   ZeRO 1–2 (optimizer states, gradients) and 3 (parameters gathered and freed per layer)
    tensor_parallel.py  Megatron's column and row splits, with sequence parallelism
    context_parallel.py, ring_attention.py   a sequence split over ranks, attention as a ring of K/V
    expert_parallel.py  experts sharded over ranks, tokens sent to them by all-to-all
"""
