"""The one validated sampling type: what a request asks of text generation.

:class:`SamplingParams` is checked here, field by field, and nowhere else: the HTTP layer
maps OpenAI's names onto it (``max_completion_tokens`` is ``max_tokens``; a speech
request's ``max_new_tokens`` too), Python callers hand it a ``sampling`` mapping, and the
schedulers resolve it over their stage's defaults
(:func:`omnictl.schedulers.sampling.SamplingParams.from_mapping`). A field left ``None``
takes the stage's default.

The ranges are OpenAI's where OpenAI has the field (temperature 0-2, penalties -2..2,
``top_logprobs`` 0-20, ``logit_bias`` values -100..100) and vLLM's for its extensions
(``top_k`` >= 0 with 0 meaning no cut, ``min_p`` 0-1, ``repetition_penalty`` > 0). An
engine that cannot honour a field a request sets refuses it by name
(:func:`refuse_unsupported`), which reaches an HTTP client as a 400.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable, Mapping

import msgspec

from omnictl.exceptions import InvalidRequest
from omnictl.wire import WireStruct

MAX_TOP_LOGPROBS = 20  # OpenAI's limit
MAX_LOGIT_BIAS = 100.0  # |bias| per token, OpenAI's limit
# The largest token id a logit_bias key may name: ids are 32-bit in every tokenizer and engine
# here (no vocabulary comes near it). A key past 2^64 could not even be carried to a stage
# (msgpack's integers are 64-bit): it was a plain-text 500 where every other integer is a 400.
MAX_TOKEN_ID = 2**31 - 1
_SEED_RANGE = (-(2**63), 2**64 - 1)  # what torch's manual_seed and msgpack carry

# The fields every engine here honours; the others are opt-in per engine.
BASIC_FIELDS = frozenset({"max_tokens", "temperature", "top_p", "top_k", "seed", "stop"})


class SamplingParams(WireStruct, frozen=True, kw_only=True):  # type: ignore[misc]  # msgspec allows a frozen Struct over the unfrozen base; mypy applies the dataclass rule
    """What the request asks of generation; None (or an empty ``stop``): the stage's default."""

    max_tokens: int | None = None
    temperature: float | None = None  # 0 means greedy
    top_p: float | None = None
    top_k: int | None = None  # 0 means no limit
    min_p: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict[int, float] | None = None  # token id -> added to its logit
    logprobs: bool | None = None  # return each chosen token's log probability
    top_logprobs: int | None = None  # and this many most likely alternatives at each position

    def __post_init__(self) -> None:
        # Every construction is checked: the HTTP layer's, a realtime session's, and the
        # one msgspec makes when the request arrives in a stage process (cheap: a few fields).
        for name in self.__struct_fields__:
            value = getattr(self, name)
            if value is not None:
                msgspec.structs.force_setattr(self, name, _check(name, value, f"sampling.{name}"))
        _check_together(self.logprobs, self.top_logprobs, "sampling.top_logprobs")

    @classmethod
    def from_mapping(
        cls, raw: Any, *, where: str = "sampling", names: Mapping[str, str] | None = None
    ) -> SamplingParams:
        """Check a ``sampling`` mapping (or pass a :class:`SamplingParams` through).

        Errors name the field as ``{where}.{key}``, or as ``names[key]`` when given (the
        HTTP layer's own names for the fields, e.g. ``{"max_tokens": "max_completion_tokens"}``),
        or as the bare key when ``where`` is empty.
        """
        if raw is None:
            return cls()
        if isinstance(raw, cls):
            return raw
        if not isinstance(raw, Mapping):
            raise InvalidRequest(f"{where}: expected an object, got {type(raw).__name__}", field=where)

        def label(key: str) -> str:
            if names and key in names:
                return names[key]
            return f"{where}.{key}" if where else key

        values: dict[str, Any] = {}
        for key, value in raw.items():
            if key not in FIELDS:
                raise InvalidRequest(
                    f"{label(str(key))}: unknown sampling field (known: {', '.join(FIELDS)})", field=label(str(key))
                )
            if value is not None:
                values[key] = _check(key, value, label(key))
        _check_together(values.get("logprobs"), values.get("top_logprobs"), label("top_logprobs"))
        return cls(**values)

    def given(self) -> list[str]:
        """The fields this request sets, in declaration order."""
        return [name for name in self.__struct_fields__ if getattr(self, name) not in (None, ())]

    def as_dict(self) -> dict[str, Any]:
        """The fields that are set, msgpack-plain (what schedulers read from ``params["sampling"]``)."""
        values: dict[str, Any] = {name: getattr(self, name) for name in self.given()}
        if "stop" in values:
            values["stop"] = list(self.stop)
        if "logit_bias" in values:
            values["logit_bias"] = dict(values["logit_bias"])
        return values

    def over(self, defaults: SamplingParams) -> SamplingParams:
        """These values, and ``defaults``'s where this request sets none."""
        merged = {name: getattr(defaults, name) for name in defaults.given()}
        merged.update({name: getattr(self, name) for name in self.given()})
        return SamplingParams(**merged)


def refuse_unsupported(params: SamplingParams, supported: Iterable[str], engine: str, where: str = "sampling") -> None:
    """Raise :class:`InvalidRequest` naming the first field ``params`` sets that this
    engine cannot honour. A value that changes nothing (``logprobs: false``, a penalty of
    0, ``repetition_penalty`` 1, ``min_p`` 0, an empty ``logit_bias``) is honoured by anyone."""
    allowed = set(supported)
    for name in params.given():
        if name in allowed or getattr(params, name) == _NEUTRAL.get(name, object()):
            continue
        raise InvalidRequest(
            f"{where}.{name}: {engine} cannot honour this field ({FIELDS[name]}); send the request without it",
            field=f"{where}.{name}",
        )


# --- the checks: one per field -----------------------------------------------------------


def _integer(value: Any, label: str, low: int | None = None, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequest(f"{label}: expected an integer, got {value!r}", field=label)
    if low is not None and value < low:
        raise InvalidRequest(f"{label}: must be >= {low}, got {value}", field=label)
    if high is not None and value > high:
        raise InvalidRequest(f"{label}: must be <= {high}, got {value}", field=label)
    return int(value)


def _number(value: Any, label: str, low: float, high: float, *, above_low: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidRequest(f"{label}: expected a number, got {value!r}", field=label)
    if above_low and not low < value <= high:
        raise InvalidRequest(f"{label}: must be in ({low:g}, {high:g}], got {float(value)}", field=label)
    if value < low:
        raise InvalidRequest(f"{label}: must be >= {low}, got {value}", field=label)
    if value > high:
        raise InvalidRequest(f"{label}: must be <= {high}, got {value}", field=label)
    return float(value)


def _stop(value: Any, label: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)):
        raise InvalidRequest(f"{label}: expected a non-empty string or a list of them, got {value!r}", field=label)
    for i, item in enumerate(value):
        if not isinstance(item, str) or not item:
            raise InvalidRequest(f"{label}[{i}]: must be a non-empty string, got {item!r}", field=f"{label}[{i}]")
    return tuple(value)


def _shown(key: Any) -> str:
    """A refused key as the error shows it: a long one clipped (the client sent it, and a
    100,000-digit integer has no repr at all: Python refuses to convert it)."""
    if isinstance(key, int) and not isinstance(key, bool) and key.bit_length() > 64:
        return f"an integer of {key.bit_length()} bits"
    text = repr(key[:64]) if isinstance(key, str) else repr(key)[:64]
    return text + (f"... ({len(key)} characters)" if isinstance(key, str) and len(key) > 64 else "")


def _logit_bias(value: Any, label: str) -> dict[int, float]:
    if not isinstance(value, Mapping):
        raise InvalidRequest(f"{label}: expected an object of token id -> bias, got {value!r}", field=label)
    bias: dict[int, float] = {}
    digits = len(str(MAX_TOKEN_ID))
    for key, amount in value.items():
        # JSON object keys are strings: "50256" is token 50256. Only so many digits are read
        # (int() of a 5,000-digit key raises, past Python's own limit on such conversions).
        token = key if isinstance(key, int) and not isinstance(key, bool) else None
        if isinstance(key, str) and key.isascii() and key.isdigit() and len(key.lstrip("0")) <= digits:
            token = int(key)
        if token is None or not 0 <= token <= MAX_TOKEN_ID:
            raise InvalidRequest(
                f"{label}: keys must be token ids (integers 0 to {MAX_TOKEN_ID}), got {_shown(key)}",
                field=label,
            )
        bias[token] = _number(amount, f"{label}.{key}", -MAX_LOGIT_BIAS, MAX_LOGIT_BIAS)
    return bias


def _boolean(value: Any, label: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidRequest(f"{label}: expected true or false, got {value!r}", field=label)
    return value


_CHECKS: dict[str, Callable[[Any, str], Any]] = {
    "max_tokens": lambda v, label: _integer(v, label, low=1),
    "temperature": lambda v, label: _number(v, label, 0.0, 2.0),
    "top_p": lambda v, label: _number(v, label, 0.0, 1.0, above_low=True),
    "top_k": lambda v, label: _integer(v, label, low=0),
    "min_p": lambda v, label: _number(v, label, 0.0, 1.0),
    "seed": lambda v, label: _integer(v, label, *_SEED_RANGE),
    "stop": _stop,
    "frequency_penalty": lambda v, label: _number(v, label, -2.0, 2.0),
    "presence_penalty": lambda v, label: _number(v, label, -2.0, 2.0),
    "repetition_penalty": lambda v, label: _number(v, label, 0.0, 2.0, above_low=True),
    "logit_bias": _logit_bias,
    "logprobs": _boolean,
    "top_logprobs": lambda v, label: _integer(v, label, low=0, high=MAX_TOP_LOGPROBS),
}

# What each field does, for the refusals.
FIELDS: dict[str, str] = {
    "max_tokens": "the most tokens to generate",
    "temperature": "sampling temperature",
    "top_p": "nucleus sampling",
    "top_k": "top-k sampling",
    "min_p": "min-p sampling",
    "seed": "seeded sampling",
    "stop": "stop strings",
    "frequency_penalty": "a penalty on tokens by how often they occurred",
    "presence_penalty": "a penalty on tokens that occurred",
    "repetition_penalty": "a multiplicative penalty on repeated tokens",
    "logit_bias": "per-token logit bias",
    "logprobs": "log probabilities of the chosen tokens",
    "top_logprobs": "log probabilities of the most likely tokens",
}
_NEUTRAL: dict[str, Any] = {
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "repetition_penalty": 1.0,
    "min_p": 0.0,
    "logprobs": False,
    "top_logprobs": 0,
    "logit_bias": {},
}


def _check(name: str, value: Any, label: str) -> Any:
    return _CHECKS[name](value, label)


def _check_together(logprobs: bool | None, top_logprobs: int | None, label: str) -> None:
    if top_logprobs and not logprobs:
        raise InvalidRequest(f"{label}: needs logprobs: true", field=label)
