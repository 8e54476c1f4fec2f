"""trace: what every rank records and how it is read back — the contract of docs/run-format.md (no torch).

recorder.py         spans, counters and flows as Chrome Trace Event JSON, written as the run goes
step_clock.py       a rank's host clock (t = 0 agreed at a barrier) and whether its step is measured
merge.py            every rank's trace in one file for Perfetto (trace.json)
validate.py         a run directory checked against the run format (`workbench validate`)
spans.py            spans read back for the analysis
"""
