"""schedules: pipeline schedules as data (torch.distributed.pipelining's shape) — per-rank action lists built,
validated, simulated, read and written as torch's CSV, placed. Plain Python, no torch: the configuration, the
estimator, the charts and the executor (pipeline/executor.py) all read the same objects."""
