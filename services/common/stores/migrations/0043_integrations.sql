-- Integrations (services/common/integrations/store.py): where the integrations stage
-- (services/integrations/) sends the broker's messages. One row per integration: its topic
-- filters and optional client id pattern, the payload format, the sink's kind and settings
-- (sink, shown by the admin API) and the sink's secrets (secrets: a SASL password; written,
-- never shown).

CREATE TABLE integrations (
    id               uuid        PRIMARY KEY,
    name             text        NOT NULL UNIQUE CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$'),
    enabled          boolean     NOT NULL DEFAULT true,
    kind             text        NOT NULL CHECK (kind IN ('kafka')),
    topic_filters    text[]      NOT NULL CHECK (cardinality(topic_filters) >= 1),
    client_id_filter text,
    payload_format   text        NOT NULL CHECK (payload_format IN ('raw', 'json')),
    sink             jsonb       NOT NULL DEFAULT '{}',
    secrets          jsonb       NOT NULL DEFAULT '{}',
    revision         bigint      NOT NULL DEFAULT 1,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now()
);

CREATE FUNCTION integrations_revise() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.revision := OLD.revision + 1;
    NEW.updated_at := now();
    RETURN NEW;
END
$$;

CREATE TRIGGER integrations_revise BEFORE UPDATE ON integrations
    FOR EACH ROW EXECUTE FUNCTION integrations_revise();

-- Every change is announced on channel cormorant_integrations once committed (NOTIFY is
-- transactional), whoever made it: the CLI, the admin API or plain SQL. The payload is the
-- integration's id; the stage loads the integrations again.
CREATE FUNCTION integrations_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('cormorant_integrations', coalesce(NEW.id, OLD.id)::text);
    RETURN NULL;
END
$$;

CREATE TRIGGER integrations_notify AFTER INSERT OR UPDATE OR DELETE ON integrations
    FOR EACH ROW EXECUTE FUNCTION integrations_notify();
