"""ONE table from the domain error tree to HTTP status and each dialect's error body."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import HTTPConnection

from gpulens.domain import errors as e

log = logging.getLogger("gpulens.api")

RUNAI_PREFIX = "/api/v1/"

# (error class, HTTP status); the first matching row wins, so subclasses come first.
STATUS_TABLE: tuple[tuple[type[e.GpulensError], int], ...] = (
    (e.InvalidParameter, 422),
    (e.InvalidRequest, 400),
    (e.NotFound, 404),
    (e.Unauthenticated, 401),
    (e.Forbidden, 403),
    (e.Conflict, 409),
    (e.PayloadTooLarge, 413),
    (e.Overloaded, 503),
    (e.BackendUnavailable, 503),
    (e.BackendTimeout, 504),
    (e.BackendBadResponse, 502),
    (e.GpulensError, 500),
)

RUNAI_MESSAGES = {
    401: "Issuer is not familiar.",
    403: "You do not have sufficient permissions.",
    404: "Resource id not found.",
    413: "Request body is too large.",
    500: "Something went wrong.",
    503: "Please try again in few minutes.",
}


def status_for(exc: e.GpulensError) -> int:
    for cls, status in STATUS_TABLE:
        if isinstance(exc, cls):
            return status
    return 500  # pragma: no cover - the last row matches every GpulensError


def is_runai(request: HTTPConnection) -> bool:
    return request.url.path.startswith(RUNAI_PREFIX)


_INT64 = 2**63


def json_safe(value: Any) -> Any:
    """`value` with everything orjson refuses made printable: strings with lone surrogates (JSON's
    "\\ud800" decodes to one) get backslash escapes, integers beyond 64 bits and other objects
    become strings. Error bodies echo what the client sent, so they must survive any of it."""
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, bool) or value is None or isinstance(value, float):
        return value
    if isinstance(value, int):
        return value if -_INT64 <= value < _INT64 else str(value)
    if isinstance(value, dict):
        return {str(json_safe(k)): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    return json_safe(str(value))


def dumps(body: Any) -> bytes:
    """JSON for an error body; never raises for what a request can put into one."""
    try:
        return orjson.dumps(body)
    except TypeError:  # orjson.JSONEncodeError
        return orjson.dumps(json_safe(body))


def json_response(status: int, body: Any, headers: dict[str, str] | None = None) -> Response:
    return Response(dumps(body), status_code=status, media_type="application/json", headers=headers)


def lyceum_validation_body(loc: list[str | int], msg: str, raw: object, kind: str = "value_error") -> Any:
    return {"detail": [{"type": kind, "loc": loc, "msg": msg, "input": raw}]}


def error_response(request: HTTPConnection, exc: e.GpulensError) -> Response:
    status = status_for(exc)
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    if isinstance(exc, e.BackendUnavailable | e.Overloaded):  # 503: when to try again (a locked store: 1 s)
        headers = {"Retry-After": str(exc.retry_after_s)}
    if is_runai(request):
        if status == 422:
            status = 400  # no 422 on the Run:ai routes
        body: dict[str, Any] = {"code": status, "message": RUNAI_MESSAGES.get(status, exc.message)}
        if body["message"] != exc.message:
            body["details"] = exc.message
        return json_response(status, body, headers)
    if isinstance(exc, e.InvalidParameter):
        return json_response(422, lyceum_validation_body([exc.location, exc.name], exc.message, exc.raw))
    return json_response(status, {"detail": exc.message}, headers)


def install(app: FastAPI) -> None:
    async def on_domain_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, e.GpulensError)
        if status_for(exc) >= 500:
            where = f" ({exc.backend})" if isinstance(exc, e.BackendError) else ""  # logged, never shown
            log.warning(
                "%s %s -> %s%s: %s", request.method, request.url.path, type(exc).__name__, where, exc.message
            )
        return error_response(request, exc)

    async def on_validation_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        if is_runai(request):
            first = exc.errors()[0] if exc.errors() else {}
            where = ".".join(str(p) for p in first.get("loc", ()))
            return json_response(
                400,
                {"code": 400, "message": "Invalid request", "details": f"{where}: {first.get('msg', '')}"},
            )
        errors = []
        for err in exc.errors():
            item = {k: err[k] for k in ("type", "loc", "msg") if k in err}
            item["input"] = err.get("input")
            if "ctx" in err:
                item["ctx"] = {k: str(v) for k, v in err["ctx"].items()}
            errors.append(item)
        return json_response(422, {"detail": errors})

    async def on_http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        headers = dict(exc.headers or {})
        if is_runai(request):
            msg = RUNAI_MESSAGES.get(exc.status_code, str(exc.detail))
            return json_response(exc.status_code, {"code": exc.status_code, "message": msg}, headers)
        return json_response(exc.status_code, {"detail": exc.detail}, headers)

    async def on_unexpected(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        if is_runai(request):
            return json_response(500, {"code": 500, "message": RUNAI_MESSAGES[500]})
        return json_response(500, {"detail": "Internal server error"})

    app.add_exception_handler(e.GpulensError, on_domain_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(Exception, on_unexpected)
