"""studies: what launches runs to measure or calibrate — above launching, analysis and the charts.

comparison.py       compare(configs): several runs side by side, each beside its estimate
calibration.py      calibrate(): this machine's rates and fixed costs for the estimator
compute_calibration.py, comm_calibration.py, run_calibration.py: its three parts
wire.py             communication on a local cluster's shaped links: α–β, DP against the rate,
                    hierarchical against the flat ring, tp placement (wire_timing.py: collectives timed there)
"""
