"""``relay``: stages on different GPUs of one host. Tensors are staged through pinned
host memory (shared-memory slots) and the receiver moves them to its own device.
Across hosts this is where a distributed engine (Ray) takes over; not built yet.
"""

from __future__ import annotations

from omnictl.transports.codec import PayloadCodec
from omnictl.topology.model import Transport


class RelayCodec(PayloadCodec):
    transport = Transport.RELAY
