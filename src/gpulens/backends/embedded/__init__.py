"""The embedded backend: the planners' PromQL evaluated in-process over a local sample source."""

from gpulens.backends.embedded.backend import EmbeddedBackend, format_value
from gpulens.backends.embedded.evaluate import SampleSource

__all__ = ["EmbeddedBackend", "SampleSource", "format_value"]
