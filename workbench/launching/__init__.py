"""launching: starting a run and following it — above the engine, which its rank entry point runs.

    launcher.py         launch(config): validate, write the request, start torchrun (or Ray), follow, load
    torchrun_command.py torchrun's command line (standalone, several machines, elastic, Nsight Systems)
    warm_torchrun.py    torchrun's agent forked from a server that imported it once (notebooks, tests)
    ray_launch.py       the ranks as Ray Train workers
    lifetime.py         a run's processes die with whoever launched them
    progress.py         start-up, then steps, tokens/s and MFU as plain text
    worker.py           the rank's entry point torchrun starts: setup, train, the traces and summary.json
    local_cluster.py    a cluster on this machine: nodes as network namespaces, links shaped by tbf
    namespace_host.py   where its namespaces live: the machine's (root) or a user namespace's holder
    cluster_launch.py   a run across its nodes: one torchrun agent in each
    lose_node.py        one of its nodes lost mid-run: its processes killed, or its link cut
    ray_cluster.py      Ray across its nodes: a head in node 0, a worker node in each other, the driver in node 0
No torch is imported by the launcher itself (worker.py runs in the ranks).
"""
