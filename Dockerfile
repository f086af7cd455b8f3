# syntax=docker/dockerfile:1.7
# Cormorant's container image: one image for every `cormorant` command.
#
#   docker buildx build --platform linux/amd64 --provenance=false -t "$REPO:0.1.0" --push .
#   docker run --rm "$REPO:0.1.0" router          # any command: ingest, router, ...
#
# The entry point is the `cormorant` CLI (services/cli.py); the command picks what runs:
# the services (ingest, router, device-persist, app-delivery, integrations-stage, admin) and the one-off tasks
# (create-topics, migrate-db). The ECS task definitions (infra/) run this image by digest
# with their command. One image rather than one per command: the per-command targets this
# file had added only metadata (entry point, ports, a health check), no file, so their
# layers were the same bytes; one image is one push, one scan and one digest per release.
# Settings come from CORMORANT_* environment variables. Only the builder stage has
# compilers; the final stage holds the virtualenv and runs as an unprivileged user.

ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION}-slim-bookworm AS builder
# Compilers for any dependency without a wheel for this platform (none on x86_64 and arm64
# today); they stay in this stage.
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential \
    && rm -rf /var/lib/apt/lists/*
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/cormorant
WORKDIR /src
COPY pyproject.toml README.md constraints.txt ./
COPY services ./services
# `cormorant analytics` is a subcommand of the one CLI (its jobs need the analytics extra,
# not installed here).
COPY spark_emr ./spark_emr
# As scripts/bootstrap.sh installs it (pip, from pyproject.toml, the versions pinned in
# constraints.txt), not editable, with the aws extra (MSK IAM authentication) instead of the
# test extra.
RUN /opt/cormorant/bin/pip install -c constraints.txt '.[aws]'

FROM python:${PYTHON_VERSION}-slim-bookworm AS runtime
# The RDS certificate authorities, for PostgreSQL with sslmode=verify-full
# (CORMORANT_POSTGRES_SSLROOTCERT). MSK and ElastiCache certificates chain to public roots
# that the image's ca-certificates already trusts.
ADD --chmod=644 https://truststore.pki.rds.amazonaws.com/global/global-bundle.pem \
    /etc/ssl/certs/rds-global-bundle.pem
RUN useradd --system --uid 10001 --user-group --create-home --home-dir /home/cormorant cormorant
COPY --from=builder /opt/cormorant /opt/cormorant
# Every process listens beyond its loopback: the admin service on CORMORANT_ADMIN_PORT.
ENV PATH=/opt/cormorant/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    CORMORANT_SETTINGS_FILE=/dev/null \
    CORMORANT_READY_FILE=/tmp/cormorant.ready \
    CORMORANT_HTTP_HOST=0.0.0.0 \
    CORMORANT_ADMIN_HOST=0.0.0.0
USER 10001:10001
WORKDIR /home/cormorant
# Every data-path service serves /health, /ready and /metrics on CORMORANT_HTTP_PORT (9180);
# ingest takes MQTT on 1883 and 8883; the admin service serves its REST API (/api, /docs),
# console (/) and /health on CORMORANT_ADMIN_PORT (9170).
EXPOSE 9180 1883 8883 9170
# The data-path services' check: a GET of their own /health (alive); load balancers use
# /ready. The admin service's is `python -m services.common.probe --admin /health`, and the
# one-off tasks have none: their ECS task definitions say so (ECS runs only the task
# definition's health check); with `docker run`, pass --health-cmd or --no-healthcheck.
HEALTHCHECK --interval=15s --timeout=5s --start-period=90s --retries=3 \
    CMD ["sh", "-c", "python -m services.common.probe /health"]
ENTRYPOINT ["cormorant"]
CMD ["--help"]
