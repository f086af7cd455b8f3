# syntax=docker/dockerfile:1.7
# Cormorant's container images: one build, one target per deployable service.
#
#   docker build --target router -t cormorant:0.1.0-router .
#
# Targets: ingest, router, device-persist, app-delivery, integrations-stage, admin (the
# services) and topics
# (the one-off task that creates the Kafka topics). Each target's entry point is its `cormorant`
# command (services/cli.py); settings come from CORMORANT_* environment variables.
# Only the builder stage has compilers; the final stages hold the virtualenv and run as an
# unprivileged user.

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
ENV PATH=/opt/cormorant/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    CORMORANT_SETTINGS_FILE=/dev/null \
    CORMORANT_READY_FILE=/tmp/cormorant.ready \
    CORMORANT_HTTP_HOST=0.0.0.0
USER 10001:10001
WORKDIR /home/cormorant
# Every service serves /health, /ready and /metrics on CORMORANT_HTTP_PORT (9180): the
# health check GETs its own /health (alive); load balancers use /ready.
EXPOSE 9180
HEALTHCHECK --interval=15s --timeout=5s --start-period=90s --retries=3 \
    CMD ["sh", "-c", "python -m services.common.probe /health"]

FROM runtime AS ingest
EXPOSE 1883 8883
ENTRYPOINT ["cormorant", "ingest"]

FROM runtime AS router
ENTRYPOINT ["cormorant", "router"]

FROM runtime AS device-persist
ENTRYPOINT ["cormorant", "device-persist"]

FROM runtime AS app-delivery
ENTRYPOINT ["cormorant", "app-delivery"]

FROM runtime AS integrations-stage
ENTRYPOINT ["cormorant", "integrations-stage"]

FROM runtime AS admin
# The REST API (/api, /docs) and the web console (/) on CORMORANT_ADMIN_PORT (9170).
ENV CORMORANT_ADMIN_HOST=0.0.0.0
EXPOSE 9170
HEALTHCHECK --interval=15s --timeout=5s --start-period=90s --retries=3 \
    CMD ["sh", "-c", "python -m services.common.probe --admin /health"]
ENTRYPOINT ["cormorant", "admin"]

FROM runtime AS topics
# Exits when every topic exists: no ready file, no health check.
HEALTHCHECK NONE
ENTRYPOINT ["cormorant", "create-topics"]

FROM runtime AS migrate
# Exits once the schema and the services' role are up to date: no health check.
HEALTHCHECK NONE
ENTRYPOINT ["cormorant", "migrate-db"]
