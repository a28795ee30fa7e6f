"""The one error tree of gpulens; api/errors.py maps it to each dialect's HTTP body.

GpulensError
├── NotFound                 404
├── InvalidRequest           400   (well-formed but not answerable: end < start, too many points)
│   └── InvalidParameter     422 Lyceum / 400 Run:ai (a parameter that does not parse)
├── Unauthenticated          401
├── Forbidden                403
├── Conflict                 409
├── PayloadTooLarge          413   (a request body over GPULENS_MAX_BODY_BYTES)
├── Overloaded               503   (no room for the work in time: summaries computing), with Retry-After
└── BackendError
    ├── BackendUnavailable   503   (connection refused, DNS, reset), with Retry-After
    │   └── StoreUnavailable 503   (the embedded SQLite store locked, busy or failing)
    ├── BackendTimeout       504
    └── BackendBadResponse   502   (error envelope, undecodable or malformed body, answer too large)
"""

from __future__ import annotations


class GpulensError(Exception):
    """Base of every error gpulens raises on purpose."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class NotFound(GpulensError):
    """The resource does not exist, or the caller may not know that it does."""


class InvalidRequest(GpulensError):
    """The request parsed but cannot be answered as asked."""


class InvalidParameter(InvalidRequest):
    """One named parameter did not parse or is out of range."""

    def __init__(self, location: str, name: str, raw: object, message: str) -> None:
        super().__init__(message)
        self.location = location
        self.name = name
        self.raw = raw


class Unauthenticated(GpulensError):
    """No credentials, or credentials that are unknown, expired or revoked."""


class Forbidden(GpulensError):
    """Valid credentials without the right to this resource."""


class Conflict(GpulensError):
    """The change collides with the current state."""


class PayloadTooLarge(GpulensError):
    """The request body is larger than the server accepts."""


class Overloaded(GpulensError):
    """gpulens itself has no room for the work now (every summary slot busy past the wait): retry."""

    retry_after_s: int = 2  # the Retry-After the 503 carries


class BackendError(GpulensError):
    """The metrics backend failed. `message` (what a client is shown) calls it "the metrics backend"
    and never says where it lives; `backend` names it (its URL) for logs only."""

    def __init__(self, backend: str, message: str) -> None:
        super().__init__(message)
        self.backend = backend


class BackendUnavailable(BackendError):
    """The backend could not be reached."""

    retry_after_s: int = 5  # the Retry-After the 503 carries


class StoreUnavailable(BackendUnavailable):
    """The embedded sample store (SQLite) is locked by another writer past its busy timeout, or
    failing (I/O error, a damaged file). `backend` names the file for logs; `message` never does."""

    retry_after_s = 1


class BackendTimeout(BackendError):
    """The backend did not answer within the configured timeout."""


class BackendBadResponse(BackendError):
    """The backend answered with an error envelope or an undecodable body."""
