"""A stage process's start-up configuration, typed on its way in (never pickled).

The launcher writes :class:`WorkerConfig` to the new process's stdin as msgpack; the
worker decodes it into the same dataclasses (the topology, its stages, enums and all),
so nothing on the way can run code when read, as an unpickled object could.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from omnictl.playback.policy import DEFAULT_POLICY
from omnictl.topology.model import Topology, Transport
from omnictl.transports.curve import CurveKeys


@dataclass(frozen=True)
class WorkerConfig:
    process: str  # the topology process whose stages this one runs
    instance: str  # this OS process's name: the process's, or ``NAME#i`` for a replica
    topology: Topology
    model_path: str | None
    process_addresses: dict[str, str]  # OS process (replica) name -> its PULL address
    coordinator_address: str
    broadcast_address: str
    profile_address: str | None
    parent_pid: int
    sys_path: tuple[str, ...]  # the parent's import path: user factories import the same here
    log_level: str = "WARNING"  # the server's (omnictl.logs.settings): records look the same from every process
    log_format: str = "text"
    log_file: str | None = None  # <run dir>/logs/<instance>.log; None: stderr only
    node: str | None = None  # its process's `node` label
    data_host: str | None = (
        "127.0.0.1"  # where it takes tcp data; None: $OMNICTL_DATA_HOST, else its Ray node's address
    )
    tcp_port: int = 0  # 0: OS-chosen; a restart asks for its predecessor's, so peers reconnect as they are
    audio_policy: str = DEFAULT_POLICY  # given to stage factories that take `audio_policy`
    curve: CurveKeys | None = None  # the launch's keys: given iff it takes tcp; every tcp socket uses CurveZMQ


def _enc_hook(obj: Any) -> Any:
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, Transport):  # an edge's: by name, the same object again on arrival
        return obj.value
    raise NotImplementedError(f"a {type(obj).__name__} has no place in a worker's configuration")


def _dec_hook(kind: type, obj: Any) -> Any:
    if kind is Path:
        return Path(obj)
    if kind is Transport:
        return Transport(obj)
    raise NotImplementedError(f"cannot decode a {kind!r} in a worker's configuration")


def encode_config(config: WorkerConfig) -> bytes:
    return msgspec.msgpack.encode(config, enc_hook=_enc_hook)


def decode_config(raw: bytes) -> WorkerConfig:
    return msgspec.msgpack.decode(raw, type=WorkerConfig, dec_hook=_dec_hook)
