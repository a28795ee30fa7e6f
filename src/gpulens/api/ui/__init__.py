"""The web dashboard: HTML pages and their static assets, served by the API app itself.

No build step and no outside request: the pages are plain HTML, the scripts plain ES modules,
and the charting library (uPlot) is vendored under `static/vendor/`. The pages hold no data; their
scripts read the Lyceum and Run:ai routes with the API key the user signs in with (kept in
sessionStorage, sent as a Bearer token; no cookies).
"""

from gpulens.api.ui.routes import install

__all__ = ["install"]
