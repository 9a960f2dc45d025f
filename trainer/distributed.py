"""Process-group setup that works alone, under torchrun/deepspeed launchers, on CPU and GPU.

On a machine without CUDA: ``DS_ACCELERATOR=cpu`` and the gloo backend, and
DeepSpeed's shared-memory comm op is not JIT-compiled (a 24 s g++ build that
gloo does not need). A single process gets RANK/WORLD_SIZE/MASTER_* defaults
so DeepSpeed does not go looking for MPI. Call ``init_distributed`` before the
first ``import deepspeed`` anywhere in the process.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass

from torch.distributed.elastic.utils.distributed import get_free_port


log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Dist:
    """Where this process sits in the job."""

    rank: int
    world_size: int
    local_rank: int
    device: str

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed() -> Dist:
    """Set up (once) the process group and return this rank's place in it."""
    import torch

    has_cuda = torch.cuda.is_available()
    if not has_cuda:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    init_method = None
    if "RANK" not in os.environ:
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(get_free_port()))
        # Alone, rendezvous through a file: a port picked now can be taken by any
        # outgoing connection (Kafka, HTTP) before the store binds it.
        folder = tempfile.mkdtemp(prefix="trajlake-dist-")
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        init_method = f"file://{folder}/rendezvous"
    import deepspeed
    import deepspeed.comm.torch  # noqa: F401  (the name resolves to torch itself: use sys.modules)

    if not has_cuda:
        # gloo needs no shared-memory op; skipping its JIT build saves ~24 s per process
        sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None
    if not torch.distributed.is_initialized():
        alone = {"init_method": init_method, "rank": 0, "world_size": 1} if init_method else {}
        deepspeed.init_distributed(dist_backend="nccl" if has_cuda else "gloo", **alone)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if has_cuda:
        torch.cuda.set_device(local_rank)
    dist = Dist(
        rank=torch.distributed.get_rank(),
        world_size=torch.distributed.get_world_size(),
        local_rank=local_rank,
        device=f"cuda:{local_rank}" if has_cuda else "cpu",
    )
    log.debug("distributed rank=%d world_size=%d device=%s", dist.rank, dist.world_size, dist.device)
    return dist


def barrier() -> None:
    import torch

    if torch.distributed.is_initialized():
        torch.distributed.barrier()


def all_ranks_agree(value: str) -> str:
    """Rank 0's ``value`` on every rank (e.g. a run decision read from the lake)."""
    import torch

    if not torch.distributed.is_initialized() or torch.distributed.get_world_size() == 1:
        return value
    box = [value]
    torch.distributed.broadcast_object_list(box, src=0)
    return box[0]
