# meshpilot's container image: a drop-in for istiod's (`pilot`) image.
#
#   docker build -t meshpilot:0.1.0 .
#
# The builder compiles the wheel (Cython hot paths, Python code generated from protos/) and the
# wheels of its dependencies; the image installs them, without a compiler, on a slim Python and runs
# as istiod's image does: uid and gid 1337, a read-only root file system is fine (docs/deploy.md).
# Istio's chart passes `discovery ...` as the container's arguments, which replace CMD here, as
# pilot-discovery takes them.
ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION}-slim AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py README.md LICENSE ./
COPY protos protos
COPY ext ext
COPY src src
# A compiler is here: a hot path that does not compile is an error, not a fallback to its twin.
ENV MESHPILOT_REQUIRE_EXTENSIONS=1
RUN pip wheel --no-cache-dir --wheel-dir /wheels . \
 && python -m venv /tmp/check \
 && /tmp/check/bin/pip install --no-cache-dir --no-index --find-links /wheels meshpilot \
 && /tmp/check/bin/python -c "from meshpilot._ext import SELECTORS; import importlib; \
bad = [s for s in SELECTORS if importlib.import_module(s).IMPLEMENTATION != 'c']; assert not bad, bad"

FROM python:${PYTHON_VERSION}-slim
# jemalloc: `meshpilot discovery` preloads it when present (src/meshpilot/server/allocator.py), so
# memory taken by a large config change goes back to the system once the change is gone.
RUN apt-get update \
 && apt-get install -y --no-install-recommends libjemalloc2 \
 && rm -rf /var/lib/apt/lists/*
RUN groupadd --gid 1337 istio-proxy \
 && useradd --uid 1337 --gid 1337 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin istio-proxy
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links /wheels meshpilot
# istiod's working directory: its relative defaults (./etc/cacerts) resolve under /.
WORKDIR /
USER 1337:1337
EXPOSE 8080 15010 15012 15014 15017
ENTRYPOINT ["meshpilot"]
CMD ["discovery"]
