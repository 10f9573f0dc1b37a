"""A tensor-parallel stage group: rank 0 is the stage process, ranks 1..N-1 its followers.

The coordinator and the other stages know rank 0 only: it runs the Stage IO shell and
the scheduler. Rank 0 starts the followers (fresh interpreters running
:mod:`omnictl.stage.tp_follower`), they join one ``torch.distributed`` group (gloo on CPU,
NCCL on GPUs) over 127.0.0.1, and every rank calls the stage's factory, each loading its
shard of the model (:mod:`omnictl.models.tensor_parallel`). Followers have no sockets of
their own and appear in no address book.

Lockstep: every runner call that touches the model or a request's state (prefill,
decode, release, ...) is first broadcast by rank 0 (:class:`RunnerMirror`) and then run by
every rank on the same inputs, so the ranks' KV caches stay identical and the forward
passes' collectives line up. A rank that dies loses the group: the calls in flight and
every later one fail naming the stage, the rank and how it died, and the stage process
exits so the restart policy restarts the whole group (a group never serves short a rank).
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable

from omnictl import logs
from omnictl.exceptions import GroupLost, StartupError
from omnictl.stage.tp_rank import RankInfo
from omnictl.topology.model import StageSpec, Topology

log = logging.getLogger(__name__)

# Runner methods every rank runs, in rank 0's order. A runner adds its own with a
# `tensor_parallel_ops` attribute (methods that change per-request state on every rank).
MIRRORED_OPS = ("prefill", "prefill_chunk", "decode", "release", "feed")
_JOIN_TIMEOUT = timedelta(minutes=10)  # loading a large model's shards takes a while
# How long a lost group's stage process waits before it exits: the failures of the
# requests in flight (naming the rank) go out first, then the restart policy takes over.
_EXIT_GRACE_S = 1.0
_STARTUP_GRACE_S = 5.0


@dataclass(frozen=True)
class FollowerConfig:
    """What a follower rank needs, pickled over its private stdin pipe (never a file)."""

    stage: str
    topology: Topology
    model_path: str | None
    rank: int
    size: int
    store_port: int
    backend: str
    parent_pid: int
    sys_path: list[str]
    log_level: str
    log_format: str


def backend_for(spec: StageSpec) -> str:
    return "nccl" if spec.gpu else "gloo"


def rank_info(spec: StageSpec, rank: int) -> RankInfo:
    return RankInfo(spec.name, rank, spec.tp_size, spec.rank_device(rank))


def rank_environment(spec: StageSpec, rank: int) -> dict[str, str]:
    """transformers binds a GPU rank to ``cuda:$LOCAL_RANK``: the rank's own GPU."""
    env = {"RANK": str(rank), "WORLD_SIZE": str(spec.tp_size)}
    env["LOCAL_RANK"] = str(spec.gpu[rank]) if spec.gpu else str(rank)
    if not spec.gpu:
        # transformers builds the group's device mesh on the machine's accelerator; a CPU
        # group (`tp_size` without `gpu`, or --device cpu) on a GPU machine must see none.
        # The stage owns its process, so hiding the GPUs here hides them from it alone.
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def join(store: Any, spec: StageSpec, rank: int) -> Any:
    """Join the group's default process group; returns the gloo group the ops travel on
    (a separate one, so they never queue behind NCCL kernels)."""
    import torch.distributed as dist

    dist.init_process_group(backend_for(spec), store=store, rank=rank, world_size=spec.tp_size, timeout=_JOIN_TIMEOUT)
    return dist.new_group(backend="gloo") if backend_for(spec) != "gloo" else dist.group.WORLD


class RunnerMirror:
    """Rank 0's side of the lockstep: wraps the runner's state-changing methods (on the
    instance, so the scheduler that holds the runner calls them unchanged) to broadcast
    each call before running it here."""

    def __init__(self, runner: Any, group: Any, stage: str) -> None:
        self.runner = runner
        self.group = group
        self.stage = stage
        self.lost: str | None = None  # how the group was lost (None: all ranks alive)
        self._lock = threading.Lock()  # one op at a time, in one order for every rank
        # Per thread: a mirrored method calling another (prefill_chunk -> prefill) runs it
        # locally; a call from another thread meanwhile still waits for the lock and is sent.
        self._nested = threading.local()
        self._last_failed = False  # piggybacked on the next op: followers check they failed alike
        self.ops = tuple(
            op for op in (*MIRRORED_OPS, *getattr(runner, "tensor_parallel_ops", ())) if hasattr(runner, op)
        )
        for op in self.ops:
            setattr(runner, op, self._mirrored(op, getattr(runner, op)))

    def _mirrored(self, op: str, local: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            if getattr(self._nested, "depth", 0):
                return local(*args, **kwargs)
            with self._lock:
                if self.lost is not None:
                    if op == "release":
                        return local(*args, **kwargs)  # forgetting a request needs no other rank
                    raise GroupLost(self.lost)
                self._nested.depth = 1
                try:
                    self._send((op, args, kwargs, self._last_failed))
                    try:
                        result = local(*args, **kwargs)
                    except GroupLost:
                        raise
                    except Exception as exc:
                        self._last_failed = True
                        if self.lost is not None or _is_transport_error(exc):
                            raise GroupLost(self._wait_for_cause()) from exc
                        raise
                    self._last_failed = False
                    return result
                finally:
                    self._nested.depth = 0

        return call

    def _send(self, message: Any) -> None:
        import torch.distributed as dist

        try:
            dist.broadcast_object_list([message], src=0, group=self.group)
        except RuntimeError as exc:  # a follower is gone: gloo's peer closed
            raise GroupLost(self._wait_for_cause()) from exc

    def _wait_for_cause(self) -> str:
        """The watcher names the dead rank; a collective may notice first, by a few ms."""
        deadline = time.monotonic() + 2.0
        while self.lost is None and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.lost or f"stage {self.stage!r}: a tensor-parallel rank stopped answering"

    def follower_kv_slots(self, timeout: float = 1.0) -> list[int] | None:
        """Each follower's KV slot count (None: the group is busy in a step, or lost)."""
        import torch.distributed as dist

        if not self._lock.acquire(timeout=timeout):
            return None
        try:
            if self.lost is not None:
                return None
            self._send(("kv_slots", (), {}, self._last_failed))
            counts: list[Any] = [None] * dist.get_world_size(self.group)
            dist.gather_object(int(self.runner.kv_slots()), counts, dst=0, group=self.group)
            return [int(c) for c in counts[1:]]
        finally:
            self._lock.release()

    def shut_down(self) -> None:
        """Tell the followers to exit (they also exit when this process goes)."""
        with self._lock:
            if self.lost is None:
                self.lost = f"stage {self.stage!r}: the group was shut down"
                try:
                    self._send(None)
                except GroupLost:
                    pass  # a follower died meanwhile: the rest exit with this process


def _is_transport_error(exc: BaseException) -> bool:
    """gloo and NCCL report a vanished peer as RuntimeError/DistBackendError from inside a forward."""
    text = f"{type(exc).__name__}: {exc}"
    return any(word in text for word in ("Connection", "connection", "DistBackendError", "Gloo", "gloo", "NCCL"))


class Group:
    """Rank 0's handle on its followers: starts them and watches them die."""

    def __init__(self, spec: StageSpec, topology: Topology, model_path: str | None) -> None:
        self.spec = spec
        self.topology = topology
        self.model_path = model_path
        self.followers: dict[int, subprocess.Popen[bytes]] = {}
        self.mirror: RunnerMirror | None = None
        self.ready = False
        self.stopping = False

    def start(self) -> Any:
        """Start the followers and join them; returns the ops group."""
        import torch.distributed as dist

        spec = self.spec
        os.environ.update(rank_environment(spec, 0))
        store = dist.TCPStore("127.0.0.1", 0, spec.tp_size, is_master=True, wait_for_workers=False)
        settings = logs.settings()
        for rank in range(1, spec.tp_size):
            config = FollowerConfig(
                stage=spec.name,
                topology=self.topology,
                model_path=self.model_path,
                rank=rank,
                size=spec.tp_size,
                store_port=int(store.port),
                backend=backend_for(spec),
                parent_pid=os.getpid(),
                sys_path=list(sys.path),
                log_level=settings.level,
                log_format=settings.format,
            )
            env = {**os.environ, **rank_environment(spec, rank)}
            process = subprocess.Popen(
                [sys.executable, "-m", "omnictl.stage.tp_follower"], stdin=subprocess.PIPE, env=env
            )
            assert process.stdin is not None
            process.stdin.write(pickle.dumps(config))
            process.stdin.close()
            self.followers[rank] = process
            threading.Thread(target=self._watch, args=(rank, process), name=f"tp-rank-{rank}", daemon=True).start()
        log.info(
            "stage %r: tensor-parallel group of %d ranks (%s), followers pid %s",
            spec.name,
            spec.tp_size,
            backend_for(spec),
            ", ".join(str(p.pid) for p in self.followers.values()),
        )
        return join(store, spec, 0)

    def _watch(self, rank: int, process: subprocess.Popen[bytes]) -> None:
        from omnictl.pids import describe_exit

        code = process.wait()
        if self.stopping or (self.mirror is not None and self.mirror.lost is not None):
            return  # shut down on purpose, or another rank went first
        cause = (
            f"stage {self.spec.name!r}: tensor-parallel rank {rank} (pid {process.pid}) died ({describe_exit(code)})"
        )
        if self.mirror is not None:
            self.mirror.lost = cause
        if not self.ready:
            # Still loading: rank 0 usually fails on its own (the same factory error, or
            # gloo's closed peer) and reports why; if it is still waiting, stop it.
            time.sleep(_STARTUP_GRACE_S)
            if not self.ready and not self.stopping:
                log.error("%s while the group was starting", cause)
                os._exit(1)
            return
        log.error("%s; the group cannot serve short a rank: stage process %d exits to restart it", cause, os.getpid())
        time.sleep(_EXIT_GRACE_S)  # let the in-flight requests' failures go out first
        os.kill(os.getpid(), signal.SIGTERM)  # the worker's clean shutdown; the launcher restarts it

    def follower_kv_slots(self) -> list[int] | None:
        return self.mirror.follower_kv_slots(timeout=0.2) if self.mirror is not None else None

    def stop(self) -> None:
        self.stopping = True
        if self.mirror is not None:
            self.mirror.shut_down()
        for process in self.followers.values():
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()


_groups: dict[str, Group] = {}


def running(stage: str) -> Group | None:
    """The group of ``stage`` in this process (None: not a tensor-parallel stage)."""
    return _groups.get(stage)


def lead(spec: StageSpec, topology: Topology, model_path: str | None, build: Callable[[], Any]) -> Any:
    """Rank 0: build the stage's scheduler (``build``) as rank 0 of its group. A factory that
    loads its model through :func:`omnictl.models.tensor_parallel.load_kwargs` starts the
    followers there; then the runner's calls are mirrored to them. An engine that runs its
    own ranks (:func:`~omnictl.models.tensor_parallel.engine_ranks`) needs nothing more."""
    from omnictl.stage.tp_rank import building

    group = Group(spec, topology, model_path)
    ops_group: list[Any] = []
    info = rank_info(spec, 0)
    info.join = lambda: ops_group.append(group.start())
    try:
        with building(info):
            scheduler = build()
    except BaseException:
        group.stop()
        raise
    if info.engine:
        return scheduler
    runner = getattr(scheduler, "runner", None)
    if not info.joined or runner is None:
        group.stop()
        raise StartupError(
            f"stage {spec.name!r}: tp_size {spec.tp_size}, but its factory "
            + ("loaded its model whole" if runner is not None else "built a scheduler without a model runner")
            + " (it would run on one rank)",
            hint="load the model with HFCausalLMRunner.from_pretrained (or pass "
            "omnictl.models.tensor_parallel.load_kwargs(config) to from_pretrained), "
            "hand engine_ranks() to an engine, or drop `tp_size`",
        )
    group.mirror = RunnerMirror(runner, ops_group[0], spec.name)
    group.ready = True
    _groups[spec.name] = group
    return scheduler
