"""analysis: what a finished run's files say — after the trace files in the flow, before the charts (no torch).

run.py              load(path) → Run: metrics, events, memory and the summary as DataFrames
summary.py          summary.json: compute / communication / overlap, memory measured beside predicted
bubble.py           a pipeline's bubble, split term by term (formula, uneven stages, transfers, gaps)
doctor.py           why a run failed: the first cause, and who was behind at which collective
recovery.py         a node lost and the run recovered: which, and when it was detected, re-formed, training again
execution_graph.py  each rank's trace as a program tied to the others by its operations
replay.py           that graph replayed: the measured step given back, the consistency check
what_if.py          the graph edited (edit_dp, edit_pipeline, edit_buckets) and replayed: another layout
"""
