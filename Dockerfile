# mcp-era-proxy image. The build needs BuildKit (`RUN --mount` below). Since Docker 23 that is the
# buildx plugin: `docker build` uses it only when it is installed, else it falls back to the legacy
# builder, which fails at the first `--mount`; `docker buildx build` never falls back. Docker 18.09
# to 22: DOCKER_BUILDKIT=1 docker build. No `# syntax=` line: BuildKit's built-in frontend supports
# `RUN --mount`, and such a line would fetch a frontend image from a registry.
#   docker buildx build --load -t mcp-era-proxy:0.1.0 .
#   docker run --rm -p 8080:8080 -p 9090:9090 \
#     -v "$PWD/proxy.yaml:/etc/mcp-era-proxy/config.yaml:ro" mcp-era-proxy:0.1.0
# Without arguments the container reads that file if it is mounted, and otherwise starts from its
# MCP_ERA_PROXY_* environment alone (docker/entrypoint.sh).
#
# The proxy's own default stays `listen: 127.0.0.1:8080`, which nothing outside the container can
# reach: the mounted config (or MCP_ERA_PROXY_LISTEN) must set `listen: 0.0.0.0:8080`,
# `admin_listen: 0.0.0.0:9090` and `security.allowed_hosts` (the Host names clients use; with a
# non-loopback listen and no list, any Host is accepted). The Helm chart in helm/ does all three.
#
# Stdio upstreams need their program inside the image: extend it (docker/Dockerfile.node adds
# Node.js for `npx` servers) rather than baking tools into this one.

# Same base in both stages: the virtualenv's interpreter path (/usr/local/bin/python3) must exist
# unchanged in the final stage. The Python minor must match the one docker/requirements.txt was
# frozen with (docker/freeze-requirements.sh); for fully reproducible builds pin a digest too
# (python:3.11-slim-bookworm@sha256:...).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---------------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS builder

# pip compiles the installed modules to bytecode here, so the final stage never has to.
ENV PIP_DISABLE_PIP_VERSION_CHECK=1

# A virtualenv without pip of its own: the base image's pip installs into it (--python), so the
# final image carries the dependencies and the project, not the installer.
RUN python -m venv --without-pip /opt/venv

# 1. Dependencies, exactly pinned, in their own layer: source edits do not invalidate it.
#    --no-deps: nothing outside the pins is installed (scripts/lint-deploy.sh checks that they are
#    complete). pip's cache lives in a BuildKit cache mount, never in a layer.
RUN --mount=type=cache,target=/root/.cache/pip \
    --mount=type=bind,source=docker/requirements.txt,target=/tmp/requirements.txt \
    pip --python /opt/venv/bin/python install --no-deps -r /tmp/requirements.txt

# 2. The project itself, without resolving dependencies again: they are all in the layer above. The
#    import check (-I: the installed package, not ./proxy) makes a dependency missing from
#    docker/requirements.txt fail the build rather than a pod (proxy.tracing.otel: the [otel]
#    extra is in the image, so setting tracing.otlp_endpoint needs no other image).
WORKDIR /src
COPY pyproject.toml README.md ./
COPY proxy/ proxy/
RUN --mount=type=cache,target=/root/.cache/pip \
    pip --python /opt/venv/bin/python install --no-deps . \
    && /opt/venv/bin/python -I -c "import proxy.cli, proxy.app, proxy.tracing.otel, uvloop" \
    && /opt/venv/bin/mcp-era-proxy --version

# ---------------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE}

# Kept equal to proxy.__version__ and the chart's appVersion (scripts/check_chart_config.py).
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="mcp-era-proxy" \
      org.opencontainers.image.description="Reverse proxy between MCP clients and servers of either protocol era" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}"

# A numeric, non-root user: Kubernetes' runAsNonRoot can only verify a numeric USER.
RUN groupadd --system --gid 10001 mcp \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin mcp

COPY --from=builder /opt/venv /opt/venv
# Executable as checked in (COPY keeps the mode; a build context sent from Windows is all 0755).
COPY docker/entrypoint.sh /usr/local/bin/docker-entrypoint.sh

# The bytecode was compiled at install time; at run time the root filesystem may be read-only.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HEALTHCHECK_URL=http://127.0.0.1:9090/healthz

USER 10001:10001
WORKDIR /tmp

# 8080: the MCP endpoint (/mcp); 9090: /healthz, /readyz, /metrics (admin_listen).
EXPOSE 8080 9090

# For plain `docker run` (Kubernetes uses the chart's probes instead). Python's stdlib only: the
# image has no curl. HEALTHCHECK_URL must match admin_listen (or listen when there is none);
# urlopen raises on a refused connection or a non-2xx status, which fails the check.
HEALTHCHECK --interval=30s --timeout=5s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen(os.environ['HEALTHCHECK_URL'], timeout=4)"]

# SIGTERM (the default stop signal) starts the proxy's graceful shutdown (shutdown.grace_s): the
# entrypoint execs the proxy, which is PID 1. No arguments by default: the entrypoint reads
# /etc/mcp-era-proxy/config.yaml when one is mounted, or none (the environment alone).
ENTRYPOINT ["docker-entrypoint.sh"]
CMD []
