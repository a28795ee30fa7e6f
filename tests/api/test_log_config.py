"""uvicorn's `log_config` for `gpulens serve`: uvicorn's own default in text mode; in JSON mode every
logger (uvicorn's startup, error and access loggers, gpulens', Python's warnings) writes JSON lines."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator

import orjson
import pytest
from uvicorn.config import LOGGING_CONFIG

from gpulens.api.observability import configure_logging, uvicorn_log_config

LOGGERS = ("", "uvicorn", "uvicorn.error", "uvicorn.access", "gpulens", "gpulens.access", "py.warnings")


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """Puts back the handlers, levels and propagation of the loggers a dictConfig here changes."""
    saved = {}
    for name in LOGGERS:
        logger = logging.getLogger(name)
        saved[name] = (list(logger.handlers), logger.level, logger.propagate, logger.disabled)
    try:
        yield
    finally:
        logging.captureWarnings(False)
        for name, (handlers, level, propagate, disabled) in saved.items():
            logger = logging.getLogger(name)
            for handler in logger.handlers:
                if handler not in handlers:
                    handler.close()
            logger.handlers[:] = handlers
            logger.setLevel(level)
            logger.propagate = propagate
            logger.disabled = disabled


def test_text_mode_is_uvicorns_default() -> None:
    config = uvicorn_log_config(False)
    assert config == LOGGING_CONFIG and config is not LOGGING_CONFIG
    config["loggers"]["uvicorn"]["level"] = "DEBUG"  # a copy: uvicorn's own is untouched
    assert LOGGING_CONFIG["loggers"]["uvicorn"]["level"] == "INFO"


def test_json_mode_makes_every_line_json(capsys: pytest.CaptureFixture[str], restore_logging: None) -> None:
    config = configure_logging(True)
    assert config == uvicorn_log_config(True), "applying it left the returned dict as it was"
    logging.getLogger("uvicorn.error").info(
        "Uvicorn running on %s", "http://127.0.0.1:8080", extra={"color_message": "\x1b[1mcoloured\x1b[0m"}
    )
    logging.getLogger("uvicorn.access").info(
        '%s - "%s %s HTTP/%s" %d', "127.0.0.1:5000", "GET", "/healthz", "1.1", 200
    )
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logging.getLogger("uvicorn.error").exception("Exception in ASGI application")
    logging.getLogger("gpulens.serve").info("gpulens on http://127.0.0.1:8080")
    logging.getLogger("gpulens.serve").debug("below the level: dropped")
    logging.getLogger("some.library").info("below the root's WARNING: dropped")
    logging.getLogger("some.library").warning("a library's warning")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("a Python warning", UserWarning, stacklevel=1)

    err = capsys.readouterr().err
    lines = [orjson.loads(line) for line in err.splitlines()]
    assert [(ln["logger"], ln["level"]) for ln in lines] == [
        ("uvicorn.error", "info"),
        ("uvicorn.access", "info"),
        ("uvicorn.error", "error"),
        ("gpulens.serve", "info"),
        ("some.library", "warning"),
        ("py.warnings", "warning"),
    ]
    assert lines[0]["msg"] == "Uvicorn running on http://127.0.0.1:8080" and "color_message" not in lines[0]
    assert lines[1]["msg"] == '127.0.0.1:5000 - "GET /healthz HTTP/1.1" 200'
    assert "RuntimeError: boom" in lines[2]["exc"]
    assert "a Python warning" in lines[5]["msg"]
    assert "\x1b" not in err


def test_json_mode_follows_the_log_level(capsys: pytest.CaptureFixture[str], restore_logging: None) -> None:
    configure_logging(True, "warning")
    logging.getLogger("gpulens.serve").info("dropped")
    logging.getLogger("gpulens.access").info("request")  # the access line is always kept
    configure_logging(True, "trace")
    logging.getLogger("gpulens.serve").debug("kept")
    lines = [orjson.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert [ln["msg"] for ln in lines] == ["request", "kept"]
    with pytest.raises(ValueError, match="loud"):
        uvicorn_log_config(True, "loud")
