"""Start one training process per GPU, or several CPU processes, on any supported detectron2.

:func:`launch` takes detectron2's ``launch`` arguments. With CUDA available (or a single process)
it is detectron2's ``launch``. Without CUDA and with more than one process it starts the processes
itself and joins them in a gloo process group: detectron2 v0.6's ``launch`` asserts CUDA in every
worker and initialises NCCL (CPU support came to detectron2's main branch in 2023, after its last
release), so gwdet takes this path on CPU whatever the detectron2 version, and the same code runs
under every version the test suite covers.
"""
from __future__ import annotations

import socket
from datetime import timedelta
from typing import Callable, Sequence

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from detectron2.engine import launch as _detectron2_launch
from detectron2.utils import comm

DEFAULT_TIMEOUT = timedelta(minutes=30)


def _free_local_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def launch(
    main_func: Callable,
    num_processes_per_machine: int,
    num_machines: int = 1,
    machine_rank: int = 0,
    dist_url: str | None = None,
    args: Sequence = (),
    timeout: timedelta = DEFAULT_TIMEOUT,
) -> None:
    """Run ``main_func(*args)`` in ``num_machines * num_processes_per_machine`` processes.

    On CPU, ``dist_url="auto"`` (one machine only) picks a free port on 127.0.0.1; several machines
    need a ``tcp://HOST:PORT`` every machine can reach.
    """
    world_size = num_machines * num_processes_per_machine
    if world_size <= 1 or torch.cuda.is_available():
        _detectron2_launch(main_func, num_processes_per_machine, num_machines=num_machines,
                           machine_rank=machine_rank, dist_url=dist_url, args=tuple(args), timeout=timeout)
        return
    if dist_url is None or dist_url == "auto":
        if num_machines != 1:
            raise ValueError("dist_url 'auto' picks a port on this machine: give tcp://HOST:PORT for several machines")
        dist_url = f"tcp://127.0.0.1:{_free_local_port()}"
    mp.start_processes(
        _cpu_worker,
        nprocs=num_processes_per_machine,
        args=(main_func, world_size, num_processes_per_machine, machine_rank, dist_url, tuple(args), timeout),
        daemon=False,
        start_method="spawn",
    )


def _cpu_worker(local_rank: int, main_func: Callable, world_size: int, num_processes_per_machine: int,
                machine_rank: int, dist_url: str, args: tuple, timeout: timedelta) -> None:
    rank = machine_rank * num_processes_per_machine + local_rank
    dist.init_process_group(backend="gloo", init_method=dist_url, world_size=world_size, rank=rank,
                            timeout=timeout)
    _create_local_process_group(num_processes_per_machine)
    comm.synchronize()
    try:
        main_func(*args)
    finally:
        dist.destroy_process_group()


def _create_local_process_group(num_processes_per_machine: int) -> None:
    """The per-machine group that ``comm.get_local_rank``/``get_local_size`` read: detectron2's
    ``comm.create_local_process_group`` where it exists (since 2023-01), else the same groups set
    into ``comm._LOCAL_PROCESS_GROUP`` as v0.6's own launch does."""
    if hasattr(comm, "create_local_process_group"):
        comm.create_local_process_group(num_processes_per_machine)
        return
    machine_rank = dist.get_rank() // num_processes_per_machine
    for machine in range(dist.get_world_size() // num_processes_per_machine):
        ranks = list(range(machine * num_processes_per_machine, (machine + 1) * num_processes_per_machine))
        group = dist.new_group(ranks)  # every rank takes part in creating every group
        if machine == machine_rank:
            comm._LOCAL_PROCESS_GROUP = group
