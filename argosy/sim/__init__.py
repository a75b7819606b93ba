"""The cluster simulator: the real scheduler on a virtual clock, with published faults.

    argosy sim generate --cluster h100:10000 --days 30 --out runs/t   # calibrated trace
    argosy sim run --cluster h100:10000 --queues runs/t/queues.yaml \
        --trace runs/t/trace.jsonl --policy argosy --json
"""
