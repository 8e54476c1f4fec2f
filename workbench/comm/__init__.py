"""comm: every collective and transfer a rank makes, traced — below parallel/ and pipeline/, which call it.

traced.py           the traced communicator: each operation a span with its bytes, its group, its deadline
groups.py           process groups from the rank grid, each with the run's timeout
ring_primitives.py  our ring reduce-scatter, all-gather and all-reduce from send/recv
hierarchical.py     reduce-scatter inside a machine, all-reduce across, all-gather inside
device_timing.py    communication timed on the GPU, and waits that block as on gloo
strict.py           strict mode: every tensor checked as NCCL would check it
emulated_link.py    the teaching device: messages held as if on a slower link between machines
"""
