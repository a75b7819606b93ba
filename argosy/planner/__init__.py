"""The auto-parallel planner: model specs, a calibrated cost model, plan search
(homogeneous and mixed-chip) and emitters for Megatron-LM, torchtitan and DeepSpeed.

Pure decisions: nothing here imports torch or touches a device.

    from argosy.planner import relative_speed
    from argosy.planner.api import estimate, plan
    result = plan(load_model("llama3-70b"), load_cluster("h100:512"), 8192, 512)
    relative_speed(load_model("llama3-8b"), "a100")   # ~0.3: tokens/s per device vs an H100

`relative_speed(model, chip)` is the scheduler's "effective throughput of job X on chip
Y": the cost model's best tokens/s per device on one scale-up domain of `chip`, divided
by the same on the reference chip (H100 SXM). It is cached and takes milliseconds.
"""

from argosy.planner.throughput import relative_speed

__all__ = ["relative_speed"]
