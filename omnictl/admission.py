"""Admission control: how many requests run at once, and what happens to the rest.

One :class:`Admission` guards a pipeline. Under the limit a request is admitted at once.
Over it, a request waits for a slot up to ``max_queue_wait`` seconds (at most as many
waiting as ``max_in_flight``); with no room to wait it is refused at once with
:class:`Overloaded` (HTTP 429 with ``Retry-After``), and one that waited too long gets
:class:`AdmissionTimeout` (HTTP 503). Refusing early is what keeps the admitted requests'
latency flat and memory bounded at many times the pipeline's capacity: work that would
only queue inside the stages never enters.

Every entry point calls the same object: the HTTP routes, ``Pipeline.submit`` (Python
callers get the typed exceptions), and any future endpoint (a realtime session turns
:class:`Overloaded` into an ``error`` event). A slot is held from :meth:`Admission.admit`
until :meth:`Ticket.release`, which is idempotent.

Backpressure: while some stage's inbox is full (it holds ``relay.inbox`` queued requests,
see :mod:`omnictl.stage.worker`), the coordinator calls :meth:`Admission.hold` and no new
request is admitted, whatever the in-flight count: new ones wait (``max_queue_wait``) or
are refused like requests over the limit. Requests already admitted keep flowing, so a
slow stage drains and nothing deadlocks; the work it cannot take yet waits outside the
pipeline, where it costs nothing, instead of in the stage's memory. This holds with the
in-flight limit off too: with no limit and no ``max_queue_wait`` (the Python API's
default, ``--max-in-flight 0``) a held request waits until the stages have room (its
``submit`` slows down); with a limit it waits up to ``max_queue_wait`` or is refused
(429) like a request over the limit.
"""

from __future__ import annotations

import asyncio
import collections
import math
from dataclasses import dataclass, field

from omnictl.exceptions import AdmissionTimeout, Overloaded
from omnictl.launch_config import AdmissionConfig, check_admission

__all__ = ["Admission", "AdmissionTimeout", "Overloaded", "Ticket", "DEFAULT_MAX_IN_FLIGHT"]

# Enough to keep a CPU pipeline's batches full, few enough that a burst at 5x capacity
# is refused at the door rather than queued in the stages (see benchmarks/overload.py).
DEFAULT_MAX_IN_FLIGHT = 64


@dataclass
class Ticket:
    """One admitted request's slot."""

    _admission: Admission
    released: bool = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self._admission._release()


@dataclass
class Admission:
    max_in_flight: int | None = DEFAULT_MAX_IN_FLIGHT  # None: no limit
    max_queue_wait: float = 0.0  # seconds a request may wait for a slot; 0: refuse at once
    in_flight: int = 0
    refused: int = 0  # Overloaded at once
    timed_out: int = 0  # AdmissionTimeout after waiting
    held: bool = False  # a stage's inbox is full: nothing new is admitted (see hold)
    _waiters: collections.deque[asyncio.Future[None]] = field(default_factory=collections.deque)

    def __post_init__(self) -> None:
        check_admission(self.max_in_flight, self.max_queue_wait)

    @classmethod
    def of(cls, config: AdmissionConfig) -> Admission:
        """The admission a launch's config asks for (its values were checked when it was made)."""
        return cls(config.max_in_flight, config.max_queue_wait)

    @property
    def queued(self) -> int:
        """Requests waiting for a slot now."""
        return len(self._waiters)

    def retry_after(self) -> int:
        """Whole seconds a refused client should wait (the ``Retry-After`` header)."""
        return max(1, math.ceil(self.max_queue_wait))

    def _has_room(self) -> bool:
        limit = self.max_in_flight
        return not self.held and (limit is None or (self.in_flight < limit and not self._waiters))

    def _patient(self) -> bool:
        # With no limit (the Python API's default) a caller held by a full stage just waits:
        # its `await submit` is the backpressure. With a limit, waiting is what it allows.
        return self.max_in_flight is None and self.max_queue_wait <= 0

    def refusal(self) -> Overloaded | None:
        """The Overloaded a new request would get at once, now (counted as refused), or None
        when it would be admitted or may wait. The server asks before reading a body: a
        refusal then costs no read and no parse, which at many times the capacity is most
        of what the refused requests would cost the admitted ones."""
        if self._has_room() or self._patient():
            return None
        limit = self.max_in_flight
        if self.max_queue_wait > 0 and (limit is None or len(self._waiters) < limit):
            return None
        self.refused += 1
        why = (
            "a stage of the pipeline is full (backpressure)"
            if self.held
            else f"the server is at its limit of {limit} requests in flight"
        )
        return Overloaded(f"{why}; retry later", retry_after=self.retry_after())

    async def admit(self) -> Ticket:
        """A slot, at once or after waiting; raises Overloaded / AdmissionTimeout."""
        if self._has_room():
            self.in_flight += 1
            return Ticket(self)
        refused = self.refusal()
        if refused is not None:
            raise refused
        patient = self._patient()
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await asyncio.wait_for(asyncio.shield(waiter), None if patient else self.max_queue_wait)
        except asyncio.TimeoutError:
            if waiter.done():  # handed a slot just as the wait ended: keep it
                return Ticket(self)
            self._waiters.remove(waiter)
            waiter.cancel()
            self.timed_out += 1
            raise AdmissionTimeout(
                f"no slot freed within {self.max_queue_wait:g} s of waiting; retry later",
                retry_after=self.retry_after(),
            ) from None
        except asyncio.CancelledError:  # the caller left while waiting
            if waiter.done() and not waiter.cancelled():
                self._release()  # the slot it was handed goes to the next one
            else:
                self._waiters.remove(waiter)
            raise
        return Ticket(self)  # the slot was handed over: in_flight already counts it

    def hold(self, held: bool) -> None:
        """Stop (``True``) or resume admitting new requests: the coordinator's backpressure
        signal, raised while some stage's inbox is full."""
        self.held = held
        limit = self.max_in_flight
        while not held and self._waiters and (limit is None or self.in_flight < limit):
            waiter = self._waiters.popleft()
            if not waiter.done():
                self.in_flight += 1
                waiter.set_result(None)

    def _release(self) -> None:
        while self._waiters and not self.held:  # hand the slot straight to the longest waiter
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self.in_flight -= 1
