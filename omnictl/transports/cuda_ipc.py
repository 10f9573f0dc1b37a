"""``cuda_ipc``: processes on the same GPU exchange CUDA IPC handles, not bytes.

GPU tensor leaves are serialized with torch's multiprocessing reductions (an IPC handle
the receiver opens on the same device); host leaves still travel through shared memory.
Only exercised where a GPU exists. Registered in
:mod:`omnictl.transports.registry`.
"""

from __future__ import annotations

import io
from typing import Any, Callable

from omnictl.transports.codec import PayloadCodec


class CudaIpcCodec(PayloadCodec):
    def _device_leaf(self) -> Callable[[Any], bytes]:
        from torch.multiprocessing.reductions import ForkingPickler  # type: ignore[attr-defined]  # torch does not export ForkingPickler in its stubs

        def dump(tensor: Any) -> bytes:
            buffer = io.BytesIO()
            ForkingPickler(buffer).dump(tensor)
            return buffer.getvalue()

        return dump
