"""The compiled grid path, when it was built: `gridjson` is the `_gridjson` extension (from
`_gridjson.c`, compiled when the package is installed where a C compiler and Python's headers are),
else None, and every caller keeps its Python path. docs/architecture.md says what it does and how
its answers are checked against the Python path's."""

from __future__ import annotations

from types import ModuleType

gridjson: ModuleType | None
try:
    from gpulens import _gridjson as gridjson
except ImportError:  # installed without a compiler: the Python paths give the same answers
    gridjson = None
