"""The scheduler: queues, quota, placement, preemption, elasticity and tidal sharing.

A pure library: it holds its own model of the cluster (free devices per node, usage per
queue) and answers "what should start, stop, grow or shrink now" given workloads and an
injected clock. It does no I/O. The simulator (`argosy.sim`) and, later, the server apply
its decisions; what the simulator measures is what the server would do.

    sched = Scheduler(cluster, tree, policy=policies.get("argosy"), clock=clock)
    sched.submit(workload)                 # rejected with a reason if it can never fit
    decisions = sched.cycle()              # Start / Stop / Resize decisions
"""
