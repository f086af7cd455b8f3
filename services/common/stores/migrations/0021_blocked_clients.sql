-- Blocked clients (services/common/auth/blocked_store.py): refused at CONNECT, before their
-- credentials are checked, on every ingest node.

CREATE TABLE mqtt_blocked (
    id          uuid        PRIMARY KEY,
    kind        text        NOT NULL
        CHECK (kind IN ('client_id', 'username', 'address', 'client_id_regex')),
    -- services/common/auth/blocked.py normalises it (an address as its CIDR network).
    value       text        NOT NULL CHECK (octet_length(value) BETWEEN 1 AND 1024),
    reason      text        NOT NULL DEFAULT '' CHECK (octet_length(reason) <= 1024),
    expires_at  timestamptz,
    created_at  timestamptz NOT NULL DEFAULT now(),
    created_by  text        NOT NULL DEFAULT '',
    UNIQUE (kind, value)
);

-- Every change is announced, once committed, on the channel cormorant_blocked that the
-- ingest nodes follow on the credentials' listening connection: they load the blocks in
-- force again (a few rows), whoever made the change.
CREATE FUNCTION mqtt_blocked_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('cormorant_blocked', TG_OP);
    RETURN NULL;
END
$$;

CREATE TRIGGER mqtt_blocked_notify AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON mqtt_blocked
    FOR EACH STATEMENT EXECUTE FUNCTION mqtt_blocked_notify();
