# syntax=docker/dockerfile:1
# gpulens as a container image: a wheel built in the first stage, installed into a slim Python
# runtime that runs `gpulens serve` as an unprivileged user. docs/operations.md (Deployment) says how
# to run it, with compose (deploy/compose.yaml) or on Kubernetes (deploy/k8s/).
#
#   docker build -t gpulens:0.1.0 .
#   docker run --rm -p 8080:8080 -e GPULENS_PROMETHEUS_URL=http://prometheus:9090 gpulens:0.1.0
#
# The same image runs the host agent: `docker run ... gpulens:0.1.0 agent --listen 0.0.0.0:9400`.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# only what the wheel is built from (.dockerignore keeps the rest of the checkout out)
COPY pyproject.toml README.md ./
COPY src ./src
# gpulens' wheel and a wheel of every dependency: the runtime stage installs offline from these
RUN python -m pip wheel --wheel-dir /wheels .

FROM ${PYTHON_IMAGE} AS runtime
ARG APP_UID=10001
RUN groupadd --system --gid "${APP_UID}" gpulens \
    && useradd --system --uid "${APP_UID}" --gid gpulens --home-dir /var/lib/gpulens \
        --no-create-home --shell /usr/sbin/nologin gpulens \
    && install -d -o gpulens -g gpulens -m 0750 /var/lib/gpulens
# the wheels are mounted for this step only: they never become a layer of the image
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    python -m pip install --no-cache-dir --root-user-action=ignore --no-index --find-links=/wheels gpulens \
    && gpulens --version

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    GPULENS_HOST=0.0.0.0 \
    GPULENS_PORT=8080 \
    GPULENS_DATA_DIR=/var/lib/gpulens

# the SQLite registry and the embedded sample store when no PostgreSQL / Prometheus is configured;
# token.secret when GPULENS_JWT_SECRET is not set
VOLUME ["/var/lib/gpulens"]
WORKDIR /var/lib/gpulens
USER ${APP_UID}:${APP_UID}
EXPOSE 8080

# liveness only (the process answers); /readyz (registry and backend) is for routing traffic
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('GPULENS_PORT', '8080'), timeout=4)"]

ENTRYPOINT ["gpulens"]
CMD ["serve"]
