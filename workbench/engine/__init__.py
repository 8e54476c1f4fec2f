"""engine: one rank's training — the strategy built once (parallelize.py), then a short step (train_step.py).

train.py            a rank's whole run: context, model, strategy, data, the steps, checkpoints, the trace
parallelize.py      the run's strategy applied to the model: DP, ZeRO, TP, PP, CP, EP and their composition
train_step.py       one step: forward and backward (or the pipeline's schedule), gradient sync, the update
checkpoint/         DCP save and load, any layout to any other, checksummed files
restart.py, faults.py, anomaly.py   restarts, injected faults, skipped steps and runs that stop
"""
