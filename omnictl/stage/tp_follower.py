"""A follower rank of a tensor-parallel stage group (see :mod:`omnictl.stage.tp_group`).

Started by rank 0 with its :class:`~omnictl.stage.tp_group.FollowerConfig` on stdin. It
joins the group, builds the stage's scheduler with its shard of the model, then runs
each runner call rank 0 broadcasts, in order, until rank 0 says stop or goes away. It
has no sockets: the coordinator and the other stages never see it.
"""

from __future__ import annotations

import logging
import os
import pickle
import sys
import threading
import time
from typing import Any

log = logging.getLogger("omnictl.stage.tp_follower")  # not __name__: it runs as __main__


def _exit_with_parent(parent_pid: int) -> None:
    """Rank 0 gone (killed, or exited to restart the group): this rank is of no use."""
    while os.getppid() == parent_pid:
        time.sleep(0.5)
    os._exit(0)


def follow(runner: Any, group: Any, rank: int, stage: str) -> None:
    """Run rank 0's calls on ``runner`` until it sends None."""
    import torch.distributed as dist

    failed = False
    while True:
        box: list[Any] = [None]
        dist.broadcast_object_list(box, src=0, group=group)
        message = box[0]
        if message is None:
            return
        op, args, kwargs, rank0_failed = message
        if rank0_failed != failed:
            # The same call on the same inputs succeeded on one rank and failed on the other:
            # the ranks' caches differ now, and every later step would be wrong.
            log.error(
                "stage %r rank %d: the last call %s here but %s on rank 0; the group must restart",
                stage,
                rank,
                "failed" if failed else "succeeded",
                "failed" if rank0_failed else "succeeded",
            )
            os._exit(3)
        if op == "kv_slots":
            dist.gather_object(int(runner.kv_slots()), None, dst=0, group=group)
            continue
        try:
            getattr(runner, op)(*args, **kwargs)
            failed = False
        except Exception as exc:  # rank 0 runs the same call and fails its requests; compared on the next op
            log.debug("stage %r rank %d: %s raised %s: %s (as on rank 0)", stage, rank, op, type(exc).__name__, exc)
            failed = True


def main() -> None:
    from omnictl import logs
    from omnictl.stage.tp_group import FollowerConfig

    config: FollowerConfig = pickle.loads(sys.stdin.buffer.read())
    logs.configure_stage_process(config.log_level, config.log_format, f"{config.stage}[rank {config.rank}]", None)  # type: ignore[arg-type]
    sys.path[:] = [*dict.fromkeys([*config.sys_path, *sys.path])]
    threading.Thread(target=_exit_with_parent, args=(config.parent_pid,), daemon=True).start()

    import torch.distributed as dist

    from omnictl.stage.build import call_factory
    from omnictl.stage.tp_group import join, rank_info
    from omnictl.stage.tp_rank import building

    spec = config.topology.stages[config.stage]
    store = dist.TCPStore("127.0.0.1", config.store_port, config.size, is_master=False)
    group = join(store, spec, config.rank)
    info = rank_info(spec, config.rank)
    with building(info):
        scheduler = call_factory(spec, config.topology, config.model_path, device=info.device)
    runner = getattr(scheduler, "runner", None)
    if runner is None:  # rank 0 refuses this stage with the reason; nothing to follow
        os._exit(2)
    follow(runner, group, config.rank, config.stage)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
