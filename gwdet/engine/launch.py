"""Start one training process per GPU, or several CPU processes, on any supported detectron2.

:func:`launch` takes detectron2's ``launch`` arguments. With CUDA available (or a single process)
it is detectron2's ``launch``. Without CUDA and with more than one process it starts the processes
itself and joins them in a gloo process group, with the per-machine process groups of
``detectron2.utils.comm``; this path is the same on every detectron2 version gwdet supports
(docs/compatibility.md: which versions' ``launch`` needs CUDA).
"""
from __future__ import annotations

import contextlib
import logging
import os
import pickle
import signal
import socket
import tempfile
import threading
import time
from datetime import timedelta
from types import FrameType
from typing import Callable, Iterator, Sequence
from urllib.parse import urlparse

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from detectron2.engine import launch as _detectron2_launch
from detectron2.utils import comm

from gwdet.checkpoint.signal_hook import TrainingInterrupted, install_stop_handlers, restore_handlers
from gwdet.errors import GwdetError, GwdetValueError

DEFAULT_TIMEOUT = timedelta(minutes=30)
DEFAULT_RENDEZVOUS_TIMEOUT = timedelta(minutes=5)


class RendezvousError(GwdetError, ConnectionError):
    """The processes of a run did not all meet at ``dist_url`` within the rendezvous timeout."""


class WorkerFailed(GwdetError, RuntimeError):
    """A training process of this machine failed; the others were stopped."""


class WorkerRefused(GwdetError, RuntimeError):
    """A training process of this machine refused the run (a :class:`~gwdet.errors.GwdetError` in it,
    whose message this is); the others were stopped."""


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
    rendezvous_timeout: timedelta = DEFAULT_RENDEZVOUS_TIMEOUT,
    evaluation: bool = False,
) -> None:
    """Run ``main_func(*args)`` in ``num_machines * num_processes_per_machine`` processes.

    On CPU, ``dist_url="auto"`` (one machine only) picks a free port on 127.0.0.1; several machines
    need a ``tcp://HOST:PORT`` every machine can reach. A ``dist_url`` the processes cannot meet at
    is refused before any starts (:func:`check_dist_url`). When a CPU process fails, the others of this
    machine are stopped and :class:`WorkerFailed` is raised with the error of the process that failed
    first, its way on said for a training (``--resume``) or, with ``evaluation``, an evaluation. A stop
    signal this process receives is sent on to the CPU processes, whose end it waits for
    (:func:`forwarded_stop_signals`; then :class:`~gwdet.checkpoint.signal_hook.TrainingInterrupted`).
    """
    for name, value, least in (("num_processes_per_machine", num_processes_per_machine, 1),
                               ("num_machines", num_machines, 1), ("machine_rank", machine_rank, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise GwdetValueError(f"launch: {name}={value!r}: give a whole number of at least {least}.")
    if machine_rank >= num_machines:
        raise GwdetValueError(f"launch: machine_rank={machine_rank} names no machine of num_machines={num_machines}: "
                              f"give each machine its rank, 0 to {num_machines - 1} (0: the first machine, whose "
                              "address dist_url gives).")
    world_size = num_machines * num_processes_per_machine
    if world_size > 1:
        check_dist_url(dist_url, num_machines)
    if num_machines > 1 and machine_rank > 0:
        wait_for_first_machine(dist_url, rendezvous_timeout)
    if world_size <= 1 or torch.cuda.is_available():
        _detectron2_launch(main_func, num_processes_per_machine, num_machines=num_machines,
                           machine_rank=machine_rank, dist_url=dist_url, args=tuple(args), timeout=timeout)
        return
    if dist_url is None or dist_url == "auto":
        dist_url = f"tcp://127.0.0.1:{_free_local_port()}"
    with tempfile.TemporaryDirectory(prefix="gwdet-refusals-") as refusals:
        context = mp.start_processes(
            _cpu_worker,
            nprocs=num_processes_per_machine,
            args=(main_func, world_size, num_processes_per_machine, machine_rank, dist_url, tuple(args), timeout,
                  rendezvous_timeout, refusals),
            daemon=False,
            start_method="spawn",
            join=False,
        )
        try:
            with forwarded_stop_signals(context) as received:
                while not context.join():
                    pass
        except (mp.ProcessRaisedException, mp.ProcessExitedException) as error:
            if received:  # told to stop, and every process did (a training's after saving a checkpoint)
                logging.getLogger(__name__).warning(_stop_report(context, error, received[0], evaluation))
                raise TrainingInterrupted(received[0], None) from None
            finished = [os.path.isfile(os.path.join(refusals, f"{index}{FINISHED}"))
                        for index in range(num_processes_per_machine)]
            if all(finished) and isinstance(error, mp.ProcessExitedException):
                # every process returned from its work: a crash in gloo's teardown at exit loses nothing
                logging.getLogger(__name__).warning(f"The processes finished their work; one then ended by {error} "
                                                    "while the process group was taken down.")
                return
            if num_processes_per_machine == 1 and isinstance(error, mp.ProcessExitedException) \
                    and error.exit_code in STOP_EXITS:
                # this machine's one process stopped on a stop signal, its own or one a process of another
                # machine received, which every process of the run shares: a stop, not a failure
                signum = int(signal.Signals[STOP_EXITS[error.exit_code]])
                logging.getLogger(__name__).warning(_stop_report(context, error, signum, evaluation))
                raise TrainingInterrupted(signum, None) from None
            first, report = _failure_report(context, error, evaluation)
            refusal = os.path.join(refusals, str(first))
            if os.path.isfile(refusal):  # the first failure was a refusal of gwdet's: its message, as one process's
                # (checked first: a process that refused may still end by SIGABRT, in gloo's teardown at its exit)
                with open(refusal, encoding="utf-8") as file:
                    raise WorkerRefused(file.read()) from WorkerFailed(report)  # --verbose: its traceback
            killed = _killed_process(context, error, evaluation) or _stopped_process(error, evaluation)
            if killed is not None:
                raise WorkerFailed(f"{killed}\n{report}") from None
            lost = _peer_lost(report, num_machines, evaluation)
            if lost is not None:
                raise WorkerFailed(f"{lost}\n{report}") from None
            if CPU_DDP_REFUSAL in report:  # a trainer of the user's own, as detectron2's DefaultTrainer builds DDP
                raise WorkerFailed(f"{CPU_DDP_HINT}\n{report}") from None
            raise WorkerFailed(report) from None


@contextlib.contextmanager
def forwarded_stop_signals(context: mp.ProcessContext) -> Iterator[list[int]]:
    """Within the block, the stop signals this process receives
    (:func:`~gwdet.checkpoint.signal_hook.install_stop_handlers`) are sent on to the processes of ``context``,
    whose hooks finish their iteration, save a checkpoint and stop, and noted in the list it yields:
    this process would otherwise end at once, before their checkpoints are written (torch then stops
    them by SIGINT). A signal that reached them too (a terminal's Ctrl-C) counts once for them."""
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():  # signals are caught in the main thread only
        yield received
        return

    def forward(signum: int, frame: FrameType | None) -> None:
        received.append(signum)
        for process in context.processes:
            if process.is_alive() and process.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signum)

    previous = install_stop_handlers(forward)
    try:
        yield received
    finally:
        restore_handlers(previous)


# --dist-url: where the processes of a run meet (torch's rendezvous handlers, and detectron2's 'auto')
DIST_URL_FORMS = ("tcp://HOST:PORT (e.g. tcp://127.0.0.1:29500; on several machines, the first machine's address)",
                  "file:///PATH (a file in a folder every process can write)",
                  "env:// (MASTER_ADDR and MASTER_PORT from the environment)",
                  "auto (a free port on this machine; one machine only)")


def check_dist_url(dist_url: str | None, num_machines: int = 1) -> None:
    """Raise ``ValueError`` naming ``--dist-url`` and the forms it takes (:data:`DIST_URL_FORMS`)
    unless ``dist_url`` is one the processes can meet at: torch finds no rendezvous for another
    scheme, and only after the processes have started. ``None`` is ``auto``. Several machines meet at
    tcp://HOST:PORT only (the first machine's address, which the others wait for); the host of a
    tcp:// or env:// address must resolve, and on one machine be an address of this machine, which
    its processes all run on (torch would retry the connection for minutes)."""
    if dist_url is None or dist_url == "auto":
        if num_machines > 1:
            raise GwdetValueError(
                "dist_url 'auto' picks a port on this machine: give tcp://HOST:PORT for several machines")
        return
    parsed = urlparse(dist_url)
    given = parsed.netloc.rpartition(":")[2]
    if parsed.scheme == "tcp" and given.isdigit() and not 1 <= int(given) <= 65535:
        raise GwdetValueError(f"--dist-url {dist_url!r}: port {given} is outside the ports there are (1 to 65535): "
                              "give a free port in that range, e.g. tcp://127.0.0.1:29500.")
    try:
        port = parsed.port
    except ValueError:  # a port that is no number
        port = None
    environment = parsed.scheme == "env" and not parsed.netloc.strip("/") and not parsed.path.strip("/")
    if environment:
        unset = [name for name in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(name)]
        if unset:
            raise GwdetValueError(f"--dist-url env:// reads the address from MASTER_ADDR and MASTER_PORT, and "
                                  f"{' and '.join(unset)} {'is' if len(unset) == 1 else 'are'} not set: export them "
                                  "(the first machine's address and a free port), or give tcp://HOST:PORT.")
        master_port = os.environ["MASTER_PORT"].strip()
        if not master_port.isdigit() or not 1 <= int(master_port) <= 65535:
            raise GwdetValueError(f"--dist-url env:// reads the port from MASTER_PORT, which is {master_port!r}: "
                                  "export a free port from 1 to 65535 (e.g. MASTER_PORT=29500).")
    if num_machines > 1:
        _tcp_address(dist_url)  # what the other machines wait for: refused alike on every machine
    if environment:
        _check_host(os.environ["MASTER_ADDR"].strip(), "MASTER_ADDR", num_machines)
        return
    if parsed.scheme == "file" and parsed.path and num_machines == 1 and os.path.isfile(parsed.path) \
            and os.path.getsize(parsed.path):
        raise GwdetValueError(f"--dist-url {dist_url}: the file exists, left by an earlier run, and torch's file "
                              "rendezvous needs a new one (the processes would wait on the old run's, or fail): delete "
                              "it, or give a new path.")
    if parsed.scheme == "tcp" and parsed.hostname and port:
        _check_host(parsed.hostname, f"--dist-url {dist_url}", num_machines)
        return
    if parsed.scheme == "file" and parsed.path:
        folder = os.path.dirname(parsed.path) or "/"
        if not os.path.isdir(folder):
            raise GwdetValueError(f"--dist-url {dist_url}: the folder {folder} does not exist, so torch's file "
                                  "rendezvous cannot create the file there: create the folder (one every process can "
                                  "write), or give a file in an existing folder.")
        if not os.access(folder, os.W_OK | os.X_OK):
            raise GwdetValueError(f"--dist-url {dist_url}: the folder {folder} cannot be written by this process, so "
                                  "torch's file rendezvous cannot create the file there: give a file in a folder every "
                                  "process can write.")
        return
    raise GwdetValueError(f"--dist-url {dist_url!r} is not an address the processes can meet at: give "
                          + ", ".join(DIST_URL_FORMS[:-1]) + f" or {DIST_URL_FORMS[-1]}.")


def _check_host(host: str, source: str, num_machines: int) -> None:
    """Refuse a ``host`` (read from ``source``) that names no address, or, on one machine, that is no
    address of this machine (nothing here can listen there)."""
    try:
        addresses = {(info[0], str(info[4][0])) for info in socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)}
    except (OSError, UnicodeError) as error:
        raise GwdetValueError(f"{source}: the host {host!r} names no address (it resolves to none: {error}): "
                              "give the first machine's IP or name, e.g. 127.0.0.1 on one machine.") from None
    if num_machines > 1:
        return
    for family, address in addresses:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            try:
                probe.bind((address, 0))
                return
            except OSError:
                continue
    raise GwdetValueError(f"{source}: the host {host!r} is not an address of this machine, and a one-machine run's "
                          "processes all run here: give 127.0.0.1 (e.g. --dist-url tcp://127.0.0.1:29500), or "
                          "--dist-url auto; with several machines give --num-machines and each its --machine-rank.")


def _failure_report(context: mp.ProcessContext, error: Exception, evaluation: bool = False) -> tuple[int, str]:
    """The local index of the process that failed first (the oldest error file; -1 when none was
    written) and the report: its traceback, then one line for each process that failed after it
    (usually because a peer disappeared from a collective operation). torch reports whichever
    failure it noticed first, which is often such a consequence."""
    failures = []
    for index, path in enumerate(context.error_files):
        if path and os.path.isfile(path) and os.path.getsize(path):
            with open(path, "rb") as file:
                failures.append((os.path.getmtime(path), index, str(pickle.load(file))))
    if not failures:
        return -1, str(error).strip()
    failures.sort()
    _, first, trace = failures[0]
    lines = [f"{_work(evaluation)} process {first} of this machine failed; the others were stopped:", trace.rstrip()]
    lines += [f"(process {index} failed after it: {text.strip().splitlines()[-1]})" for _, index, text in failures[1:]]
    return first, "\n".join(lines)


# torch's refusal of DistributedDataParallel(device_ids=[...]) for a model on the CPU, and what to do
CPU_DDP_REFUSAL = "DistributedDataParallel device_ids and output_device arguments only work with"
CPU_DDP_HINT = ("The training processes run on the CPU, and a trainer wrapped the model in DistributedDataParallel with "
                "device_ids (as detectron2's DefaultTrainer does), which torch refuses for a CPU model. Base a trainer "
                "of your own on gwdet.engine.trainer.Trainer, which wraps it without device_ids on the CPU, or run it "
                "with one process (--num-gpus 1). What the processes reported:")


# Signals a process sends itself when it crashes (C++'s std::terminate aborts; a memory fault).
CRASH_SIGNALS = ("SIGABRT", "SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL")


def _work(evaluation: bool) -> str:
    """What the processes do, as the failure reports name it."""
    return "Evaluation" if evaluation else "Training"


# What to do after a process was killed or stopped: a training continues, an evaluation runs again.
_RESUME = "The checkpoints written before it are kept: continue with --resume."
_EVALUATE_AGAIN = "An evaluation keeps nothing of a stopped run: run the same --eval-only command again."


def _killed_process(context: mp.ProcessContext, error: Exception, evaluation: bool = False) -> str | None:
    """The first line of the report where a process of this machine was killed by a signal, from
    outside (the out-of-memory killer, a scheduler, ``kill -9``) or by a crash inside it
    (:data:`CRASH_SIGNALS`): which one, by what signal, and that ``--resume`` continues from the last
    checkpoint; ``None`` where none was (a process raised an error)."""
    index, signal_name = None, None
    if isinstance(error, mp.ProcessExitedException) and error.signal_name:
        index, signal_name = error.error_index, error.signal_name
    else:  # another process noticed its peer gone first; SIGKILL is never torch's first way to stop one
        for position, process in enumerate(context.processes):
            if process.exitcode == -signal.SIGKILL:
                index, signal_name = position, "SIGKILL"
                break
    if index is None:
        return None
    cause = ("a crash inside it: a library that aborted, a memory fault" if signal_name in CRASH_SIGNALS
             else "from outside the run: the out-of-memory killer, a scheduler, kill" if signal_name == "SIGKILL"
             else "from outside the run: a scheduler, kill")
    return (f"{_work(evaluation)} process {index} of this machine was killed by {signal_name} ({cause}); the others "
            f"were stopped. {_EVALUATE_AGAIN if evaluation else _RESUME} What the other processes reported:")


# gloo's words when a peer process went away in a collective operation (its process killed, its machine lost)
PEER_LOST = ("Connection reset by peer", "Connection closed by peer")


def _peer_lost(report: str, num_machines: int, evaluation: bool = False) -> str | None:
    """The first line of the failure ``report`` of a run of ``num_machines`` machines where a process
    of this machine failed because a process of another machine went away (gloo's
    :data:`PEER_LOST`): killed there, or that machine lost; ``None`` otherwise."""
    if num_machines < 2 or not any(words in report for words in PEER_LOST):
        return None
    way_on = _EVALUATE_AGAIN if evaluation else ("The checkpoints written before are kept: continue with --resume on "
                                                 "every machine.")
    return ("A process of another machine of the run went away while the processes worked together (gloo: connection "
            "closed or reset by its peer): killed there (the out-of-memory killer, a scheduler, kill), or that machine "
            f"lost; this machine's processes were stopped. {way_on} What this machine's processes reported:")


def _stop_report(context: mp.ProcessContext, error: Exception, signum: int, evaluation: bool) -> str:
    """What the processes of ``context`` did when told to stop by ``signum``, ``error`` being how
    the first one ended: a training's checkpoint hook saves a checkpoint of the iteration, which every
    process waits for, and exits with 128 + the signal (:data:`STOP_EXITS`); a first process that
    ended otherwise (the signal's default action before the hook was installed or after training, a
    second signal, which stops at once) saved none."""
    name = signal.Signals(signum).name
    if evaluation:
        return f"Stopped by {name}: the processes were told to stop and did. {_EVALUATE_AGAIN}"
    if isinstance(error, mp.ProcessExitedException) and error.exit_code in STOP_EXITS:
        return (f"Stopped by {name}: the processes were told to stop and did. They saved a checkpoint of their "
                "iteration: continue with --resume.")
    return (f"Stopped by {name}: the processes were told to stop and did, at once, without a checkpoint of their "
            "iteration (a second signal, or one that came before training started or after it ended; exit statuses "
            f"{', '.join(str(process.exitcode) for process in context.processes)}). A process whose peer stopped may "
            "have printed gloo's 'Connection closed by peer'. --resume continues from the last checkpoint written, "
            "if any.")


# the exit statuses of a training process that a stop signal ended after it saved a checkpoint of its
# iteration (gwdet.checkpoint.signal_hook exits with 128 + the signal's number, as a shell reports it)
STOP_EXITS = {128 + int(stop): stop.name for stop in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR2)}


def _stopped_process(error: Exception, evaluation: bool = False) -> str | None:
    """The first line of the report where a process of this machine ended on a stop signal sent
    to it alone (a scheduler's, ``kill -TERM <pid>``): it saved a checkpoint of its iteration first;
    ``None`` otherwise."""
    if not isinstance(error, mp.ProcessExitedException) or error.exit_code not in STOP_EXITS:
        return None
    if evaluation:
        return (f"Evaluation process {error.error_index} of this machine was stopped by {STOP_EXITS[error.exit_code]} "
                f"(sent to it alone); the others were stopped. {_EVALUATE_AGAIN} What torch reported:")
    return (f"Training process {error.error_index} of this machine was stopped by {STOP_EXITS[error.exit_code]} "
            "(sent to it alone); the others were stopped. A checkpoint of its iteration was saved before it stopped "
            "when it was training: continue with --resume. What torch reported:")


def _tcp_address(dist_url: str | None) -> tuple[str, int]:
    parsed = urlparse(dist_url or "")
    if parsed.scheme != "tcp" or not parsed.hostname or not parsed.port:
        raise GwdetValueError(f"--dist-url {dist_url!r}: several machines meet at tcp://HOST:PORT, the address of "
                              "the first machine (--machine-rank 0), e.g. tcp://10.0.0.1:29500")
    return parsed.hostname, parsed.port


def wait_for_first_machine(dist_url: str | None, timeout: timedelta = DEFAULT_RENDEZVOUS_TIMEOUT) -> None:
    """Return once something accepts connections at ``dist_url``; :class:`RendezvousError` when
    nothing does within ``timeout``."""
    host, port = _tcp_address(dist_url)
    deadline = time.monotonic() + timeout.total_seconds()
    while True:
        try:
            with socket.create_connection((host, port), timeout=min(5.0, timeout.total_seconds())):
                return
        except OSError as error:
            if time.monotonic() >= deadline:
                raise RendezvousError(
                    f"Nothing answers at --dist-url {dist_url} after {timeout.total_seconds():.0f} s ({error}). "
                    "Start the first machine (--machine-rank 0) with the same --dist-url and --num-machines, "
                    "check that HOST is its address and that PORT is open between the machines; "
                    "--rendezvous-timeout sets how long to wait.") from None
        time.sleep(0.5)


def _init_gloo(rank: int, world_size: int, processes_per_machine: int, dist_url: str, timeout: timedelta,
               rendezvous_timeout: timedelta) -> None:
    """Join the gloo process group; at a tcp:// address the joining is bounded by ``rendezvous_timeout``,
    and every process checks it was started for the same process counts (:func:`_check_same_layout`)."""
    if not dist_url.startswith("tcp://"):
        dist.init_process_group(backend="gloo", init_method=dist_url, world_size=world_size, rank=rank,
                                timeout=timeout)
        return
    host, port = _tcp_address(dist_url)
    try:
        store = dist.TCPStore(host, port, world_size, is_master=rank == 0, timeout=rendezvous_timeout,
                              wait_for_workers=True)
    except RuntimeError as error:  # torch's DistStoreError / DistNetworkError
        waited = rendezvous_timeout.total_seconds()
        if rank == 0 and ("EADDRINUSE" in str(error) or "address already in use" in str(error).lower()):
            last = world_size // processes_per_machine - 1  # the last machine's rank
            ranks = "1" if last == 1 else f"1 to {last}"
            raise RendezvousError(
                f"--dist-url {dist_url}: another program already listens on port {port} of {host}, so the processes "
                "cannot meet there. " + (f"It may be the first machine of this run, started already with --machine-rank "
                                         f"0: start this machine with its own --machine-rank ({ranks}); else give "
                                         "another port." if last else
                                         "Give another port (or --dist-url auto on one machine).")
            ) from None
        raise RendezvousError(
            f"Process {rank} of {world_size} could not meet the others at {dist_url} within {waited:.0f} s: {error}. "
            "Start every machine with the same --dist-url and --num-machines and --machine-rank 0 to "
            "N-1; --rendezvous-timeout sets how long to wait.") from None
    _check_same_layout(store, rank, world_size, processes_per_machine, dist_url, rendezvous_timeout)
    store.set_timeout(timeout)
    dist.init_process_group(backend="gloo", store=store, world_size=world_size, rank=rank, timeout=timeout)


def _check_same_layout(store: dist.TCPStore, rank: int, world_size: int, processes_per_machine: int, dist_url: str,
                       rendezvous_timeout: timedelta) -> None:
    """Refuse, in every process, machines started with other process counts (``--num-gpus``,
    ``--num-machines``) than the first machine: each process records its count and compares it with
    process 0's, which waits for every rank of its own count (gloo's joining would otherwise wait
    without end for ranks that never come)."""
    layout = f"{world_size} processes, {processes_per_machine} per machine"
    store.set(f"gwdet/layout/{rank}", layout)
    fix = ("Start every machine with the same --num-gpus (processes per machine) and --num-machines; "
           "--rendezvous-timeout sets how long to wait.")
    try:
        if rank == 0:
            store.wait([f"gwdet/layout/{other}" for other in range(world_size)], rendezvous_timeout)
        first = store.get("gwdet/layout/0").decode()
    except RuntimeError:  # torch's DistStoreError: a rank of this count did not come
        raise RendezvousError(
            f"Process {rank} ({layout}) waited {rendezvous_timeout.total_seconds():.0f} s at {dist_url} for processes "
            f"that did not come: the other machines were started with other process counts, or not at all. "
            f"{fix}") from None
    if first != layout:
        raise RendezvousError(f"Process {rank} was started for {layout}, the first machine's processes for {first}. "
                              f"{fix}")


# the mark a CPU process leaves beside the refusals once its work has returned
FINISHED = ".finished"


def _cpu_worker(local_rank: int, main_func: Callable, world_size: int, num_processes_per_machine: int,
                machine_rank: int, dist_url: str, args: tuple, timeout: timedelta,
                rendezvous_timeout: timedelta, refusals: str) -> None:
    """One CPU process of the run: ``main_func(*args)`` in the gloo group. A refusal of gwdet's is
    written to ``refusals/<local rank>`` before it propagates, for :func:`launch` to report as it is."""
    rank = machine_rank * num_processes_per_machine + local_rank
    try:
        _init_gloo(rank, world_size, num_processes_per_machine, dist_url, timeout, rendezvous_timeout)
        _create_local_process_group(num_processes_per_machine)
        comm.synchronize()
        main_func(*args)
    except GwdetError as error:
        with open(os.path.join(refusals, str(local_rank)), "w", encoding="utf-8") as file:
            file.write(str(error.args[0]) if error.args else str(error))
        raise
    open(os.path.join(refusals, f"{local_rank}{FINISHED}"), "w").close()  # for launch: the work is done
    # Not on an exception: torch records this process's error first, and only when the process
    # exits do its peers see the connections close, so the first error recorded is the cause.
    dist.destroy_process_group()


def _create_local_process_group(num_processes_per_machine: int) -> None:
    """The per-machine group that ``comm.get_local_rank``/``get_local_size`` read: detectron2's
    ``comm.create_local_process_group`` where it exists, else the same groups set
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
