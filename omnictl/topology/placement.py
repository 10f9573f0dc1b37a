"""Placement rules: tensor-parallel sizes, which stages may share a process, and the
`processes` knobs."""

from __future__ import annotations

import difflib

from omnictl.topology.raw import RawProcess, RawStage, Reporter


def check_tp_size(stage: RawStage, report: Reporter) -> None:
    """``tp-size``: `tp_size` matches the `gpu` list; ids are non-negative and distinct.

    Without `gpu`, `tp_size: N` means N CPU ranks (no GPU list to match); a single GPU id
    holds one rank, so `tp_size` > 1 beside it is an error."""
    if {"gpu", "tp_size"} & stage.malformed:
        return
    gpus = stage.gpu or ()
    if stage.gpu_is_list and stage.tp_size is not None and stage.tp_size != len(gpus):
        report.add(
            "tp-size",
            f"stage {stage.name!r} has tp_size {stage.tp_size} but {len(gpus)} GPU(s) in `gpu`",
            stage=stage,
            field="tp_size",
            at=("tp_size",),
            hint="list one GPU id per tensor-parallel rank, or drop "
            "`tp_size` (it defaults to the length of the `gpu` list)",
        )
    if stage.gpu is not None and not stage.gpu_is_list and (stage.tp_size or 1) > 1:
        report.add(
            "tp-size",
            f"stage {stage.name!r} has tp_size {stage.tp_size} but a single GPU in `gpu`",
            stage=stage,
            field="tp_size",
            at=("tp_size",),
            hint=f"give `gpu` a list of {stage.tp_size} distinct GPU ids, or drop `gpu` "
            f"to run {stage.tp_size} CPU ranks",
        )
    seen: set[int] = set()
    for index, gpu in enumerate(gpus):
        at = ("gpu", index)  # a single id has no index: the position falls back to `gpu`
        if gpu < 0:
            report.add(
                "tp-size",
                f"stage {stage.name!r} has a negative GPU id {gpu}",
                stage=stage,
                field="gpu",
                at=at,
                hint="GPU ids start at 0",
            )
        elif gpu in seen:
            report.add(
                "tp-size",
                f"stage {stage.name!r} lists GPU {gpu} twice",
                stage=stage,
                field="gpu",
                at=at,
                hint="each tensor-parallel rank needs its own GPU",
            )
        seen.add(gpu)


def check_processes(by_name: dict[str, RawStage], report: Reporter) -> None:
    """``process-placement``: TP stages own their process; one GPU per process."""
    members: dict[str, list[RawStage]] = {}
    for stage in by_name.values():
        if "process" not in stage.malformed:
            members.setdefault(stage.process_name, []).append(stage)
    for process, stages in members.items():
        for stage in stages:
            if stage.is_tensor_parallel and len(stages) > 1:
                others = ", ".join(s.name for s in stages if s is not stage)
                report.add(
                    "process-placement",
                    f"tensor-parallel stage {stage.name!r} shares process {process!r} with {others}",
                    stage=stage,
                    field="process",
                    at=("process",),
                    hint="a tensor-parallel stage owns its process; give the other stages a different `process`",
                )
        placed = [s for s in stages if s.gpu and not s.is_tensor_parallel and "gpu" not in s.malformed]
        if not placed:
            continue
        home = placed[0].gpu[0] if placed[0].gpu else 0
        for stage in placed:
            if stage.gpu and stage.gpu[0] != home:
                where = ", ".join(f"{s.name} on {s.gpu[0] if s.gpu else '-'}" for s in placed)
                report.add(
                    "process-placement",
                    f"process {process!r} has GPU stages on different GPUs ({where})",
                    stage=stage,
                    field="gpu",
                    at=("gpu",),
                    hint="the GPU stages of one process share one GPU; move this stage "
                    "to another `process` or to GPU " + str(home),
                )
                break


def check_declared_processes(processes: dict[str, RawProcess], stages: list[RawStage], report: Reporter) -> None:
    """``unknown-process``: every key of `processes` is a process some stage runs in."""
    used = list(dict.fromkeys(s.process_name for s in stages if "process" not in s.malformed))
    if any("process" in s.malformed for s in stages):
        return  # a malformed `process` may be the one this key names: the schema said why
    for name, process in processes.items():
        if process.min_over_max:
            report.add(
                "replica-bounds",
                f"process {name!r}: `replicas` has `min` above `max`",
                field="replicas",
                at=process.path + ("replicas", "min"),
                hint="the autoscaler runs between `min` and `max` replicas: use min <= max",
            )
        if name in used:
            continue
        close = difflib.get_close_matches(name, used, n=1)
        hint = (
            (f"did you mean {close[0]!r}? " if close else "")
            + "processes stages run in: "
            + ", ".join(used)
            + " (a stage without `process` runs in one named after it)"
        )
        report.add(
            "unknown-process",
            f"`processes` names {name!r}, which no stage runs in",
            field="processes",
            at=process.path,
            key=True,
            hint=hint,
        )


def check_group_nodes(processes: dict[str, RawProcess], by_name: dict[str, RawStage], report: Reporter) -> None:
    """``tp-node``: a process runs on one node; so the ranks of a tensor-parallel group share one.

    `node` as a list (one label per rank) is read only to say so at its line: a group's ranks
    talk over gloo or NCCL, which omnictl keeps on one machine."""
    groups = {s.process_name: s for s in by_name.values() if s.is_tensor_parallel and "process" not in s.malformed}
    for name, process in processes.items():
        if len(set(process.node_labels)) < 2:
            continue
        labels = ", ".join(process.node_labels)
        stage = groups.get(name)
        if stage is not None:
            message = (
                f"the ranks of tensor-parallel stage {stage.name!r} (process {name!r}) are spread "
                f"over nodes {labels}; a group's ranks share one node"
            )
            hint = "give `node` one label; to use another node too, add `replicas` (each replica is a whole group)"
        else:
            message = f"process {name!r} names several nodes ({labels}); a process runs on one node"
            hint = "give `node` one label, or split the stages into processes with a label each"
        report.add("tp-node", message, field="node", at=process.path + ("node",), hint=hint)
