"""What the OpenAPI document says a route may answer besides success, in each dialect's error shape.

api/errors.py makes the bodies; this module only describes them, so every status a route can return
is documented with its model (tests/api/test_fuzz.py holds the document to what the server does):

* Lyceum and the admin API: `{"detail": "..."}` (`ErrorDetail`), and for 422 FastAPI's
  `HTTPValidationError` (`{"detail": [{"type", "loc", "msg", "input"}]}`), which FastAPI documents
  itself on every route with parameters or a body;
* Run:ai (`/api/v1/...`): `{"code", "message", "details"?}` inline (ERROR_SCHEMA), never 422.

Date-time texts in the document are patterns, not `format: date-time`: gpulens accepts only
timestamps between 1970 and 2261 (domain/timeparse), which a format cannot say. The patterns
describe RFC 3339 texts inside that range (an offset may move a time by a day, so 1971-2260);
the server accepts more spellings than they list (ISO 8601 forms, Unix seconds).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, WithJsonSchema

from gpulens.domain.workloads import UUID_RE

# Inline (not a named component), so no route's schema clashes on "Error".
ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["code", "message"],
    "properties": {
        "code": {"type": "integer", "minimum": 100, "maximum": 599},
        "message": {"type": "string"},
        "details": {"type": "string"},
    },
}


class ErrorDetail(BaseModel):
    """A Lyceum or admin error: what went wrong, in words."""

    detail: str


LYCEUM_TEXTS = {
    400: "The request cannot be answered as asked (end before start, too many points, an id of the "
    "wrong form), or its body is not decodable JSON",
    401: "Missing, unknown, expired or revoked credentials",
    403: "Not allowed: an admin route without an admin key, another project, or an organization "
    "the token does not name",
    404: "Not found (or not visible to the caller's organization)",
    409: "Conflicts with the current state (e.g. an id of another organization)",
    413: "The request body is larger than GPULENS_MAX_BODY_BYTES",
    502: "The metrics backend answered with an error or a malformed or too large answer",
    503: "The metrics backend or the registry is unavailable; retry later",
    504: "The metrics backend did not answer within GPULENS_BACKEND_TIMEOUT",
}

RUNAI_TEXTS = {
    400: "Bad request.",
    401: "Unauthorized.",
    403: "Forbidden.",
    404: "Not found.",
    413: "Request body is too large.",
    500: "Unexpected error.",
    502: "Bad gateway: the metrics backend failed.",
    503: "Unavailable.",
    504: "Gateway timeout: the metrics backend did not answer in time.",
}

# Statuses by what a route does.
# Every bearer route: 401 without usable credentials, 403 for a JWT naming an organization it is
# not a member of, 503 when the registry that holds the keys is unavailable.
AUTH = (401, 403, 503)
TENANT = (*AUTH, 404)  # one object of the caller's organization
BODY = (400, 413)  # a body that cannot be decoded; one over the size cap
BACKEND = (502, 503, 504)
EXECUTION_READ = (400, *TENANT, *BACKEND)  # the metrics, summary and export of one execution


def lyceum_errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """`responses=` for a Lyceum or admin route: each code with ErrorDetail."""
    return {code: {"model": ErrorDetail, "description": LYCEUM_TEXTS[code]} for code in sorted(set(codes))}


def runai_errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """`responses=` for a Run:ai route: each code with the vendor's error object."""
    return {
        code: {"description": RUNAI_TEXTS[code], "content": {"application/json": {"schema": ERROR_SCHEMA}}}
        for code in sorted(set(codes))
    }


_YEAR = r"(?:197[1-9]|19[89][0-9]|2[01][0-9]{2}|22[0-5][0-9]|2260)"
_MONTH_DAY = (
    r"(?:(?:0[1-9]|1[0-2])-(?:0[1-9]|1[0-9]|2[0-8])"
    r"|(?:0[13-9]|1[0-2])-(?:29|30)"
    r"|(?:0[13578]|1[02])-31)"
)
_TIME = r"(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]{1,6})?"
_ZONE = r"(?:[Zz]|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"
RFC3339 = f"{_YEAR}-{_MONTH_DAY}[Tt]{_TIME}{_ZONE}"
TIMESTAMP_PATTERN = f"^{RFC3339}$"
# a query parameter: RFC 3339 or Unix seconds (at most 9 digits: before 2001-09-09)
QUERY_TIMESTAMP_PATTERN = f"^(?:{RFC3339}|[0-9]{{1,9}}(?:\\.[0-9]{{1,3}})?)$"
# a Prometheus duration of at least a second and at most a year (e.g. 5s, 1m, 1h30m), or seconds
DURATION_PATTERN = r"^(?:[1-9][0-9]{0,2}[smhd]|[1-9][0-9]{0,3}ms|[1-9][0-9]{0,5})$"

# A path id that must be a UUID (the service answers 400 for another text).
UUID_PATH: dict[str, Any] = {"format": "uuid", "pattern": f"^{UUID_RE}$"}
TIME_QUERY: dict[str, Any] = {"pattern": QUERY_TIMESTAMP_PATTERN}
TIMESTAMP_SCHEMA: dict[str, Any] = {
    "type": "string",
    "pattern": TIMESTAMP_PATTERN,
    "description": "RFC 3339 date-time with any offset, between 1970 and 2261 (stored and returned in UTC)",
}

# A request body's date-time, documented by TIMESTAMP_SCHEMA (validated as a datetime; the range is
# checked by the service).
Timestamp = Annotated[datetime, WithJsonSchema(TIMESTAMP_SCHEMA)]
