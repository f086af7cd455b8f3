-- Leases on the ingest nodes' ids (services/ingest/node_lease.py): an autoscaled ingest task
-- takes the lowest free slot of a bounded pool and is node `ingest-<slot>` while it renews
-- the lease before expires_at. Each node id names a Kafka downlink topic, so the topics stay
-- as few as the pool's slots however often tasks are replaced. holder: who holds it now
-- (the ECS task id, or host and process id), for the operator and for renewals. prefix: the
-- deployment's topic_prefix, since deployments that share a Kafka cluster by their prefixes
-- may share this database too.

CREATE TABLE ingest_node_leases (
    prefix     text        NOT NULL,
    slot       integer     NOT NULL CHECK (slot >= 1),
    holder     text        NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (prefix, slot)
);
