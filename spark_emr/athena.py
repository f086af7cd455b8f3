"""The report's questions as Athena SQL over the Iceberg archive (Athena engine version 3,
Trino's dialect): ``infra/`` saves each as a named query of the analysts' workgroup, and
docs/analytics.md shows them. Each reads the last day by its partitions (``date``), so a
query scans one or two days of files, not the archive.

Plain data, no Spark: the Pulumi program imports it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Query:
    """One saved query: ``name`` (Athena's, unique in the workgroup), ``description`` and
    ``sql`` with ``{database}`` standing for the Glue database of the archive."""

    name: str
    description: str
    sql: str

    def for_database(self, database: str) -> str:
        """The SQL against Glue database ``database``."""
        return self.sql.format(database=database)


_LAST_DAY = "date >= current_date - INTERVAL '1' DAY"

QUERIES = (
    Query(
        "traffic-by-topic-level",
        "Messages and bytes per first topic level, last day",
        f"""SELECT split_part(topic, '/', 1) AS topic_level_1,
       count(*) AS messages,
       sum(payload_size) AS bytes
FROM "{{database}}"."messages"
WHERE {_LAST_DAY} AND record_error IS NULL
GROUP BY 1
ORDER BY messages DESC
LIMIT 100""",
    ),
    Query(
        "qos-mix",
        "Messages per QoS and retained flag, last day",
        f"""SELECT qos, retain, count(*) AS messages, sum(payload_size) AS bytes
FROM "{{database}}"."messages"
WHERE {_LAST_DAY} AND record_error IS NULL
GROUP BY qos, retain
ORDER BY qos, retain""",
    ),
    Query(
        "fleet-activity",
        "Connects, disconnects and distinct clients per hour, last day",
        f"""SELECT date, hour,
       count_if(kind = 'CONNECTED') AS connects,
       count_if(kind = 'DISCONNECTED') AS disconnects,
       count(DISTINCT client_id) AS clients
FROM "{{database}}"."events"
WHERE {_LAST_DAY} AND record_error IS NULL
GROUP BY date, hour
ORDER BY date, hour""",
    ),
    Query(
        "reconnect-storms",
        "Minutes with 10 or more reconnects (a connect within 60 s of the same client's "
        "disconnect), last day",
        f"""WITH ordered AS (
    SELECT client_id, kind, at,
           lag(kind) OVER (PARTITION BY client_id ORDER BY at, kafka_offset) AS previous_kind,
           lag(at) OVER (PARTITION BY client_id ORDER BY at, kafka_offset) AS previous_at
    FROM "{{database}}"."events"
    WHERE {_LAST_DAY} AND record_error IS NULL AND kind IN ('CONNECTED', 'DISCONNECTED')
)
SELECT date_trunc('minute', at) AS minute,
       count(*) AS connects,
       count_if(previous_kind = 'DISCONNECTED'
                AND date_diff('millisecond', previous_at, at) <= 60000) AS reconnects
FROM ordered
WHERE kind = 'CONNECTED'
GROUP BY 1
HAVING count_if(previous_kind = 'DISCONNECTED'
                AND date_diff('millisecond', previous_at, at) <= 60000) >= 10
ORDER BY minute""",
    ),
    Query(
        "delivery-latency",
        "Latency from PUBLISH received to routed, per delivery path, and to sent from a "
        "store (ms percentiles), last day",
        f"""WITH latencies AS (
    SELECT 'routed to ' || stage AS stage,
           date_diff('millisecond', received_at, routed_at) AS latency_ms
    FROM "{{database}}"."deliveries"
    WHERE {_LAST_DAY} AND record_error IS NULL AND received_at IS NOT NULL
      AND NOT (stage = 'downlink' AND cardinality(filter(target_packet_ids, p -> p > 0)) > 0)
    UNION ALL
    SELECT 'sent from store' AS stage,
           date_diff('millisecond', received_at, routed_at) AS latency_ms
    FROM "{{database}}"."deliveries" CROSS JOIN UNNEST(target_packet_ids) AS t (packet_id)
    WHERE {_LAST_DAY} AND record_error IS NULL AND received_at IS NOT NULL
      AND stage = 'downlink' AND packet_id > 0
)
SELECT stage,
       count(*) AS messages,
       approx_percentile(latency_ms, 0.5) AS p50_ms,
       approx_percentile(latency_ms, 0.9) AS p90_ms,
       approx_percentile(latency_ms, 0.99) AS p99_ms
FROM latencies
GROUP BY stage
ORDER BY stage""",
    ),
    Query(
        "auth-failures",
        "Authentication failures per client host, last day",
        f"""SELECT regexp_extract(client_address, '^\\[?(.*?)\\]?(:\\d+)?$', 1) AS client_host,
       count(*) AS failures,
       count(DISTINCT client_id) AS client_ids,
       min(at) AS first_at,
       max(at) AS last_at
FROM "{{database}}"."events"
WHERE {_LAST_DAY} AND record_error IS NULL AND kind = 'AUTH_FAILED'
GROUP BY 1
ORDER BY failures DESC
LIMIT 100""",
    ),
    Query(
        "stored-backlog",
        "Messages stored for persistent sessions against acknowledgements, per client, last day",
        f"""WITH stored AS (
    SELECT key AS client_id, count(*) AS stored
    FROM "{{database}}"."deliveries"
    WHERE {_LAST_DAY} AND record_error IS NULL AND stage = 'persisted'
    GROUP BY key
), acknowledged AS (
    SELECT client_id, count(*) AS acknowledged
    FROM "{{database}}"."acks"
    WHERE {_LAST_DAY} AND record_error IS NULL AND kind IN ('PUBACK', 'PUBCOMP')
    GROUP BY client_id
)
SELECT coalesce(s.client_id, a.client_id) AS client_id,
       coalesce(stored, 0) AS stored,
       coalesce(acknowledged, 0) AS acknowledged,
       greatest(coalesce(stored, 0) - coalesce(acknowledged, 0), 0) AS backlog
FROM stored s FULL OUTER JOIN acknowledged a ON s.client_id = a.client_id
ORDER BY backlog DESC
LIMIT 100""",
    ),
)
