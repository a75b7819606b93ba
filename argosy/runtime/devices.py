"""Which device a rank trains on, and which process-group backend goes with it.

Pure functions of the spec, the rank's LOCAL_RANK and the node's CUDA device count, so
they are tested on any machine with a made-up count; the script asks torch for the count.

    resolve_device("auto", local_rank=1, cuda_count=8)          -> "cuda:1"
    resolve_device("auto", local_rank=0, cuda_count=0)          -> "cpu"
    resolve_device("cuda", local_rank=9, cuda_count=8)          -> "cuda:1"
    resolve_device("cuda:3", local_rank=0, cuda_count=8)        -> "cuda:3"
    backend_for("cuda:1") -> "nccl";  backend_for("cpu") -> "gloo"

Accepted specs: `auto` (cuda when every local rank can have a GPU of its own, else cpu),
`cpu`, `cuda` (this rank's GPU: `cuda:<LOCAL_RANK % count>`), `cuda:<i>` (that GPU, one
local rank only). NCCL refuses two ranks of one communicator on one GPU, so `cuda` with
more local ranks than GPUs (`local_world`) is refused here, with the fix, instead of
failing later inside NCCL. Anything else raises ValueError listing the accepted forms.
"""

from __future__ import annotations

from argosy.core.device_spec import FORMS, parse_device_spec

__all__ = ["FORMS", "backend_for", "resolve_device"]


def resolve_device(
    spec: str, local_rank: int = 0, cuda_count: int = 0, local_world: int = 1
) -> str:
    """The torch device string this rank uses ("cpu" or "cuda:<i>"); see the module doc."""
    if local_rank < 0 or local_world < 1 or cuda_count < 0:
        raise ValueError(
            f"local_rank {local_rank}, local_world {local_world}, cuda_count {cuda_count}: "
            "expected local_rank >= 0, local_world >= 1, cuda_count >= 0"
        )
    kind, index = parse_device_spec(spec)
    spec = spec.strip().lower()
    if kind == "cpu":
        return "cpu"
    if kind == "auto":
        return f"cuda:{local_rank % cuda_count}" if cuda_count >= local_world else "cpu"
    if index is None:
        _check_cuda(spec, cuda_count, local_world)
        return f"cuda:{local_rank % cuda_count}"
    _check_cuda(spec, cuda_count, 1)
    if index >= cuda_count:
        raise ValueError(
            f"device '{spec}': this node has {cuda_count} CUDA device(s), "
            f"cuda:0 to cuda:{cuda_count - 1}; accepted forms: {FORMS}"
        )
    if local_world > 1:
        raise ValueError(
            f"device '{spec}' puts all {local_world} local ranks on one GPU, which NCCL "
            "refuses; use --device cuda (one GPU per local rank)"
        )
    return f"cuda:{index}"


def _check_cuda(spec: str, cuda_count: int, local_ranks: int) -> None:
    if cuda_count == 0:
        raise ValueError(f"device '{spec}': no CUDA device is visible; use --device cpu or auto")
    if local_ranks > cuda_count:
        raise ValueError(
            f"device '{spec}': {local_ranks} ranks on this node but {cuda_count} CUDA "
            f"device(s); NCCL needs one GPU per rank: use --nproc-per-node {cuda_count} "
            "or --device cpu"
        )


def backend_for(device: str) -> str:
    """The torch.distributed backend for a resolved device: nccl for CUDA, gloo for CPU."""
    kind = device.split(":", 1)[0]
    if kind == "cuda":
        return "nccl"
    if kind == "cpu":
        return "gloo"
    raise ValueError(f"device '{device}': no process-group backend known; expected cpu or cuda")
