"""Mixed-chip training: run the planner's non-uniform plans across chip types.

`plan` (plan -> rank assignments, pure), `weighting` (sample-weighted averages, pure),
`emulate` (chip identities and throttling on CPU), `allreduce` (hierarchical all-reduce
across vendor groups, DDP communication hook), `gradsync` (bucketed, backward-overlapped
sync for argosy's own loop), `pipeline` (layer-split plans: stages by the plan's layer
counts, GPipe over send/recv), `rebalance` (batch shares that follow measured speeds,
pure), `rank` (the in-script side), `report` (throughput
accounting), `launching` (the launcher's side). Modules that need torch import it
themselves; importing this package does not.
"""

__all__ = [
    "allreduce",
    "emulate",
    "gradsync",
    "launching",
    "pipeline",
    "plan",
    "rank",
    "rebalance",
    "report",
    "weighting",
]
