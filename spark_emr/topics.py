"""The archive's Kafka topics for one deployment, resolved from the shared topic names.

Kept apart from the jobs: :mod:`services.common.kafka.names` reads the settings (pydantic),
which the EMR job environment does not need; the jobs get the resolved names as arguments.
"""

from __future__ import annotations

from services.common.kafka.names import (
    APP_PREFIX,
    APP_SHARED_PREFIX,
    DOWNLINK_PREFIX,
    TopicNames,
)
from spark_emr.jobs.archive import ArchiveTopics


def archive_topics(names: TopicNames) -> ArchiveTopics:
    """The topics :mod:`spark_emr.jobs.archive` reads, with ``names``' prefix."""
    return ArchiveTopics(
        msg_all=names.msg_all,
        client_events=names.client_events,
        client_acks=names.client_acks,
        msg_persisted=names.msg_persisted,
        downlink_prefix=names.prefix + DOWNLINK_PREFIX,
        app_prefix=names.prefix + APP_PREFIX,
        app_shared_prefix=names.prefix + APP_SHARED_PREFIX,
    )
