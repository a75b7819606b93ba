"""The fault-tolerant training runtime: launcher agent, in-script hooks, watchdog, goodput.

Light at import: torch is imported only by the hooks' DDP helper and the checkpoint
adapter, when a training script calls them.
"""
