"""Turn a StageSpec into a running Stage: call the factory, resolve the hooks."""

from __future__ import annotations

import inspect
from typing import Any, Callable

from omnictl.profiling.events import Profiler
from omnictl.schedulers.base import Scheduler
from omnictl.schedulers.simple import SimpleScheduler
from omnictl.stage.fanin import FanIn
from omnictl.stage.router import Router
from omnictl.stage.stage import Ports, Stage
from omnictl.topology.imports import resolve_callable, topology_dir
from omnictl.topology.model import StageSpec, Topology


def _resolve(topology: Topology, spec: StageSpec, field: str, dotted: str) -> Callable[..., Any]:
    """The callable at ``dotted``, found the way ``validate --check-imports`` finds it."""
    where = f"{topology.path}:{spec.line} `{field}` of stage {spec.name!r}"
    return resolve_callable(dotted, topology_dir(topology.path), where=where)


def _accepts(fn: Callable[..., Any], keyword: str) -> bool:
    try:
        parameters = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # builtins without a signature
        return False
    return keyword in parameters or any(p.kind is p.VAR_KEYWORD for p in parameters.values())


def make_scheduler(
    spec: StageSpec, topology: Topology, model_path: str | None, audio_policy: str | None = None
) -> Scheduler:
    """``factory(**factory_args)`` plus ``model_path=`` / ``device=`` / ``audio_policy=`` when
    it takes them (a value in ``factory_args`` wins: the topology chose it for that stage).

    A stage with ``tp_size`` > 1 is built as rank 0 of its group (:mod:`omnictl.stage.tp_group`)."""
    if spec.tp_size > 1:
        from omnictl.stage import tp_group

        scheduler: Scheduler = tp_group.lead(
            spec, topology, model_path, lambda: call_factory(spec, topology, model_path, audio_policy=audio_policy)
        )
        return scheduler
    return call_factory(spec, topology, model_path, audio_policy=audio_policy)


def call_factory(
    spec: StageSpec,
    topology: Topology,
    model_path: str | None,
    device: str | None = None,
    audio_policy: str | None = None,
) -> Scheduler:
    """The factory's scheduler on this process alone; ``device`` (default: the stage's)
    is a tensor-parallel follower's own."""
    factory = _resolve(topology, spec, "factory", spec.factory)
    kwargs = dict(spec.factory_args)
    if audio_policy is not None and "audio_policy" not in kwargs and _accepts(factory, "audio_policy"):
        kwargs["audio_policy"] = audio_policy
    if model_path is not None and "model_path" not in kwargs and _accepts(factory, "model_path"):
        kwargs["model_path"] = model_path
    if "device" not in kwargs and _accepts(factory, "device"):
        kwargs["device"] = device or spec.device
    built = factory(**kwargs)
    if isinstance(built, Scheduler):
        return built
    if callable(built):
        return SimpleScheduler(built)
    raise TypeError(
        f"factory {spec.factory} of stage {spec.name!r} returned {type(built).__name__}; "
        "expected a Scheduler or a callable"
    )


def build_stage(
    spec: StageSpec,
    topology: Topology,
    model_path: str | None,
    ports: Ports,
    profiler: Profiler,
    audio_policy: str | None = None,
) -> Stage:
    scheduler = make_scheduler(spec, topology, model_path, audio_policy)
    merge = _resolve(topology, spec, "merge_fn", spec.merge_fn) if spec.merge_fn else None
    route_fn = _resolve(topology, spec, "route_fn", spec.route_fn) if spec.route_fn else None
    projections = {target: _resolve(topology, spec, f"project.{target}", path) for target, path in spec.project.items()}
    fanin = FanIn(topology.upstreams(spec.name), merge)
    return Stage(spec, scheduler, fanin, Router(spec, route_fn, projections), ports, profiler)
