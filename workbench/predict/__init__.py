"""predict: what a run will cost before it runs — formulas, the estimator, the planner, the step-time model
and the GPU presets (no torch; nothing that trains imports it).

    formulas/           memory, FLOPs, communication, activations, bubbles: each with its source (docs/formulas.md)
    estimator.py        estimate(config): memory per rank, bytes per step, step time
    run_layout.py       RunLayout: what the estimator reads of a run (a RunConfig's, or one no RunConfig says)
    planner.py          plan(model, cluster): the layouts that fit, fastest first
    step_time.py        the step-time model: every action costed, the pipeline simulated, buckets overlapped
    hardware.py         GPU presets (achievable rates, links) and a calibrated machine
"""
