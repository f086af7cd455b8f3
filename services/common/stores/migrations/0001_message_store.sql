-- The message store of persistent DEVICE sessions (services/common/stores/postgres_store.py).

-- One row per client: its counters, and the row every operation on the client locks
-- (SELECT ... FOR UPDATE), which serialises them.
CREATE TABLE persisted_clients (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- SHA-256 of the UTF-8 client id. Client ids may be 65,535 bytes long, which no B-tree
    -- index entry holds (at most about 2.7 kB), so the id itself is not indexed.
    client_key     bytea    NOT NULL UNIQUE CHECK (length(client_key) = 32),
    client_id      text     NOT NULL,
    last_seq       bigint   NOT NULL DEFAULT 0,
    last_packet_id integer  NOT NULL DEFAULT 0,
    -- Highest msg.persisted offset appended; -1: none.
    source_offset  bigint   NOT NULL DEFAULT -1,
    -- Rows in persisted_messages, kept here so the cap costs no count(*).
    stored         integer  NOT NULL DEFAULT 0,
    dropped        bigint   NOT NULL DEFAULT 0
);

CREATE TABLE persisted_messages (
    client_ref    bigint   NOT NULL REFERENCES persisted_clients (id) ON DELETE CASCADE,
    seq           bigint   NOT NULL,
    packet_id     integer  NOT NULL CHECK (packet_id BETWEEN 1 AND 65535),
    qos           smallint NOT NULL CHECK (qos IN (1, 2)),
    -- 0 QUEUED, 1 SENT, 2 RELEASED (services/common/stores/base.py MessageState).
    state         smallint NOT NULL CHECK (state IN (0, 1, 2)),
    expires_at_ms bigint   NOT NULL,
    data          bytea    NOT NULL,
    PRIMARY KEY (client_ref, seq),
    UNIQUE (client_ref, packet_id)
);
