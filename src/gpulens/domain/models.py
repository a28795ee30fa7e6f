"""Frozen value types passed between the stages (times are integer milliseconds since the epoch)."""

from __future__ import annotations

import enum
import math
from bisect import bisect_left, bisect_right
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from itertools import compress
from typing import overload

import orjson

from gpulens.domain import limits

# Ids from requests later go into PromQL and URLs, so they are strict. Bodies without anchors: use
# re.fullmatch in Python (`$` would accept a trailing newline) and wrap in ^...$ for pydantic.
# The lengths are domain/limits.py's.
EXECUTION_ID_RE = rf"[A-Za-z0-9._:-]{{1,{limits.EXECUTION_ID_MAX}}}"
ORG_SLUG_RE = rf"[a-z0-9][a-z0-9-]{{0,{limits.ORG_SLUG_MAX - 1}}}"
HOSTNAME_RE = rf"[A-Za-z0-9][A-Za-z0-9._-]{{0,{limits.HOSTNAME_MAX - 1}}}"
GPU_INDEX_RE = rf"[0-9]{{1,{limits.GPU_INDEX_DIGITS}}}"
GPU_UUID_RE = rf"(?:GPU|MIG)-[0-9a-zA-Z-]{{1,{limits.GPU_UUID_MAX}}}"
GPU_ID_RE = f"{GPU_INDEX_RE}|{GPU_UUID_RE}"  # an index or a GPU/MIG UUID
PROJECT_RE = rf"[A-Za-z0-9][A-Za-z0-9._-]{{0,{limits.PROJECT_MAX - 1}}}"
USER_RE = rf"[A-Za-z0-9][A-Za-z0-9._@+-]{{0,{limits.USER_MAX - 1}}}"

# What each pattern accepts, in words, for error messages (API, services and CLI alike).
ORG_SLUG_TEXT = f"an org slug (1-{limits.ORG_SLUG_MAX} characters of [a-z0-9-], not starting with -)"
PROJECT_TEXT = f"a project name (1-{limits.PROJECT_MAX} characters of [A-Za-z0-9._-])"
USER_TEXT = (
    f"a user name (1-{limits.USER_MAX} characters of [A-Za-z0-9._@+-], not starting with one of ._@+-)"
)
HOSTNAME_TEXT = f"a host name (1-{limits.HOSTNAME_MAX} characters of [A-Za-z0-9._-])"
EXECUTION_ID_TEXT = f"1-{limits.EXECUTION_ID_MAX} characters of [A-Za-z0-9._:-]"
GPU_ID_TEXT = f"GPU indices (0-{10**limits.GPU_INDEX_DIGITS - 1}) or GPU/MIG UUIDs"


class ExecutionStatus(enum.StrEnum):
    PENDING = "pending"
    STARTING = "starting"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    SYSTEM_FAILURE = "system_failure"
    CANCELLED = "cancelled"
    ABORTED = "aborted"

    @property
    def is_active(self) -> bool:
        return self in (ExecutionStatus.PENDING, ExecutionStatus.STARTING, ExecutionStatus.RUNNING)


@dataclass(frozen=True, slots=True)
class Execution:
    """One run on one host, as the registry knows it."""

    execution_id: str
    org: str
    hostname: str | None
    gpus: tuple[str, ...]  # GPU indices ("0") and/or UUIDs ("GPU-..."); empty = every GPU of the host
    status: ExecutionStatus
    created_at: datetime
    start_time: datetime | None = None
    end_time: datetime | None = None
    hardware_profile: str | None = None
    execution_type: str | None = None
    file_name: str | None = None
    return_code: int | None = None
    system_errors: tuple[str, ...] = ()
    project: str | None = None
    user: str | None = None  # who ran it (a login or an e-mail address), for usage and alert rules


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: resolved from an API key or a JWT."""

    org: str
    subject: str  # key prefix, or the JWT's `sub`
    is_admin: bool = False
    projects: frozenset[str] | None = None  # None: every project of the org
    key_id: str | None = None
    # When the caller's API key expires (None: never, or not a key); keys it creates end by then too.
    key_expires_at: datetime | None = None

    def may_see_project(self, project: str | None) -> bool:
        return self.projects is None or project is None or project in self.projects


@dataclass(frozen=True, slots=True)
class Window:
    """An evaluation grid: start + k*step for k = 0.. while <= end (all in ms)."""

    start_ms: int
    end_ms: int
    step_ms: int

    @property
    def points(self) -> int:
        return (self.end_ms - self.start_ms) // self.step_ms + 1


@dataclass(frozen=True, slots=True)
class RangeQuery:
    """One PromQL range query over one chunk of a grid."""

    expr: str
    window: Window


# One sample as the Prometheus API encodes it: (unix seconds, "decimal string"). Values stay strings
# from the backend to the wire: no float round-trip, and the dialects that want strings get them free.
# The embedded backend makes these tuples; the Prometheus backend passes on the pairs of its decoded
# JSON as they are (2-item lists, shape checked by `valid_samples`: no copy per point), so read a
# sample by unpacking or index, never by its type.
Sample = tuple[float, str]


class DecodedSamples(Sequence[Sample]):
    """Samples whose values are the backend's decimal texts as bytes (`texts[k]`, checked to be JSON
    numbers, or NaN/+Inf/-Inf where a subclass says so) with their floats (`numbers[k]`), decoded
    without a Python object per sample beyond these. Read as the sequence of (unix seconds, "text")
    they stand for, or by their fields; a subclass says where the times are.

    Made packed (`_pack`: the compiled grid path, docs/architecture.md), they hold only `blob`, the n
    texts comma-joined; `texts` and `numbers` are made from it when first read, so a reader that
    needs neither (the Lyceum encoder) never makes an object per sample."""

    __slots__ = ("_blob", "_n", "_numbers", "_texts")

    def __init__(self, texts: list[bytes], numbers: list[float]) -> None:
        if len(texts) != len(numbers):
            raise ValueError("one number a text")
        self._texts: list[bytes] | None = texts
        self._numbers: list[float] | None = numbers
        self._blob: bytes | None = None
        self._n = len(texts)

    def _pack(self, blob: bytes, n: int) -> None:
        if n <= 0 or blob.count(b",") != n - 1:
            raise ValueError("a blob holds its n texts comma-joined")
        self._texts = self._numbers = None
        self._blob = blob
        self._n = n

    @property
    def blob(self) -> bytes | None:
        """The n texts comma-joined when made packed; else None."""
        return self._blob

    @property
    def texts(self) -> list[bytes]:
        if self._texts is None:
            assert self._blob is not None
            self._texts = self._blob.split(b",")
        return self._texts

    @property
    def numbers(self) -> list[float]:
        if self._numbers is None:
            self._numbers = _numbers_of(self._blob, self.texts, self._special())
        return self._numbers

    def _special(self) -> list[int]:
        """The indices of the NaN/+Inf/-Inf texts (only a subclass that allows them has any)."""
        return []

    def seconds_at(self, k: int) -> float:  # pragma: no cover - every subclass says
        raise NotImplementedError

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, index: int) -> Sample: ...

    @overload
    def __getitem__(self, index: slice) -> list[Sample]: ...

    def __getitem__(self, index: int | slice) -> Sample | list[Sample]:
        if isinstance(index, slice):
            return [self[k] for k in range(*index.indices(self._n))]
        k = index + self._n if index < 0 else index
        if not 0 <= k < self._n:
            raise IndexError("sample index out of range")
        return (self.seconds_at(k), self.texts[k].decode("ascii"))

    def __iter__(self) -> Iterator[Sample]:
        return map(self.__getitem__, range(self._n))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str | bytes):
            return NotImplemented
        return len(self) == len(other) and all(
            a[0] == b[0] and a[1] == b[1] for a, b in zip(self, other, strict=True)
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(n={self._n})"


class TimedSamples(DecodedSamples):
    """Samples at any times (a raw selector's): `seconds[k]` as the backend wrote it (a number)."""

    __slots__ = ("seconds",)

    def __init__(self, seconds: list[float], texts: list[bytes], numbers: list[float]) -> None:
        super().__init__(texts, numbers)
        if len(seconds) != len(texts):
            raise ValueError("one time a sample")
        self.seconds = seconds

    @classmethod
    def concat(cls, parts: Sequence[TimedSamples]) -> TimedSamples:
        seconds: list[float] = []
        texts: list[bytes] = []
        numbers: list[float] = []
        for part in parts:
            seconds += part.seconds
            texts += part.texts
            numbers += part.numbers
        return cls(seconds, texts, numbers)

    def tail(self, start: int) -> TimedSamples:
        return TimedSamples(self.seconds[start:], self.texts[start:], self.numbers[start:])

    def seconds_at(self, k: int) -> float:
        return self.seconds[k]


class GridSamples(DecodedSamples):
    """Samples on a gap-free grid: the k-th at `first_ms + k * step_ms`. The Prometheus backend
    decodes a gap-free range answer into this; the Lyceum encoder and the array shaping read its
    fields."""

    __slots__ = ("first_ms", "step_ms")

    def __init__(self, first_ms: int, step_ms: int, texts: list[bytes], numbers: list[float]) -> None:
        super().__init__(texts, numbers)
        if step_ms <= 0:
            raise ValueError("a grid needs a positive step")
        self.first_ms = first_ms
        self.step_ms = step_ms

    @classmethod
    def packed(cls, first_ms: int, step_ms: int, blob: bytes, n: int) -> GridSamples:
        """n finite texts, comma-joined in `blob` (checked by the caller to be JSON numbers)."""
        if step_ms <= 0:
            raise ValueError("a grid needs a positive step")
        made = cls.__new__(cls)
        made._pack(blob, n)
        made.first_ms, made.step_ms = first_ms, step_ms
        return made

    @property
    def last_ms(self) -> int:
        return self.first_ms + (self._n - 1) * self.step_ms

    def seconds_at(self, k: int) -> float:
        return (self.first_ms + k * self.step_ms) / 1000


class GridPoints(DecodedSamples):
    """Samples at some points of a grid: the k-th at `first_ms + offsets[k] * step_ms` (offsets
    ascending; gaps where the backend answered nothing, as VictoriaMetrics leaves for missed scrapes),
    any of them NaN or +/-Inf (`texts[k]` `NaN`, `+Inf`, `-Inf`, `numbers[k]` the float), the indices of
    those in `bad` (ascending). The Prometheus backend decodes a range answer into this where it is
    not a `GridSamples`; shaping/pod_gpus.py makes one of a GPU's several series."""

    __slots__ = ("_offsets", "bad", "first_ms", "step_ms")

    def __init__(
        self,
        first_ms: int,
        step_ms: int,
        offsets: list[int],
        texts: list[bytes],
        numbers: list[float],
        bad: list[int],
    ) -> None:
        super().__init__(texts, numbers)
        if step_ms <= 0:
            raise ValueError("a grid needs a positive step")
        if len(offsets) != len(texts):
            raise ValueError("one offset a sample")
        self.first_ms = first_ms
        self.step_ms = step_ms
        self._offsets: list[int] | None = offsets
        self.bad = bad

    @classmethod
    def packed(
        cls, first_ms: int, step_ms: int, offsets: list[int] | None, blob: bytes, n: int, bad: list[int]
    ) -> GridPoints:
        """n texts comma-joined in `blob` (checked by the caller: JSON numbers, or NaN/+Inf/-Inf at
        the indices `bad`); `offsets` None: the k-th at grid index k (no gap)."""
        if step_ms <= 0:
            raise ValueError("a grid needs a positive step")
        if offsets is not None and len(offsets) != n:
            raise ValueError("one offset a sample")
        made = cls.__new__(cls)
        made._pack(blob, n)
        made.first_ms, made.step_ms, made._offsets, made.bad = first_ms, step_ms, offsets, bad
        return made

    @property
    def offsets(self) -> list[int]:
        if self._offsets is None:
            self._offsets = list(range(self._n))
        return self._offsets

    @property
    def packed_offsets(self) -> list[int] | None:
        """The offsets as made: None for gap-free packed samples (not made into a list)."""
        return self._offsets

    def _special(self) -> list[int]:
        return self.bad

    def seconds_at(self, k: int) -> float:
        return (self.first_ms + self.offsets[k] * self.step_ms) / 1000

    def finite_inside(self, lo_ms: int, hi_ms: int) -> tuple[list[int], list[bytes]]:
        """(offsets, texts) of the finite samples at lo_ms..hi_ms."""
        return finite_inside(self.first_ms, self.step_ms, self.offsets, self.texts, self.bad, lo_ms, hi_ms)


def _numbers_of(blob: bytes | None, texts: list[bytes], special: list[int]) -> list[float]:
    """The floats of JSON number texts (`blob`: them comma-joined, when at hand), the ones at the
    indices `special` spelled NaN, +Inf or -Inf."""
    if not special:
        numbers: list[float] = orjson.loads(b"[" + (blob if blob is not None else b",".join(texts)) + b"]")
        return numbers
    plain = list(texts)
    for k in special:
        plain[k] = b"0"
    numbers = orjson.loads(b"[" + b",".join(plain) + b"]")
    for k in special:
        numbers[k] = special_number(texts[k][0])
    return numbers


def special_number(lead: int) -> float:
    """The float of the API's other spellings of a value by their first byte: `N`aN, `+`Inf, `-`Inf."""
    return math.nan if lead == ord("N") else (math.inf if lead == ord("+") else -math.inf)


def finite_inside(
    first_ms: int,
    step_ms: int,
    offsets: list[int],
    texts: list[bytes],
    bad: list[int],
    lo_ms: int,
    hi_ms: int,
) -> tuple[list[int], list[bytes]]:
    """(offsets, texts) of the samples at grid points `first_ms + offsets[k] * step_ms` (ascending)
    inside [lo_ms, hi_ms], leaving out the indices in `bad`: slices and C calls, no Python frame per
    sample."""
    lo = bisect_left(offsets, -((first_ms - lo_ms) // step_ms))  # the first at or after lo_ms
    hi = bisect_right(offsets, (hi_ms - first_ms) // step_ms)
    at, values = offsets[lo:hi], texts[lo:hi]
    dropped = [k - lo for k in bad if lo <= k < hi]
    if dropped:
        keep = [True] * len(at)
        for k in dropped:
            keep[k] = False
        at, values = list(compress(at, keep)), list(compress(values, keep))
    return at, values


@dataclass(frozen=True, slots=True)
class Series:
    """One result series: its labels and its samples in ascending time."""

    labels: dict[str, str] = field(default_factory=dict)
    samples: Sequence[Sample] = field(default_factory=list)
