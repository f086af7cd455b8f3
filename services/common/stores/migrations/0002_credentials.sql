-- Credentials of MQTT clients (services/common/auth/store.py): who may connect, their client
-- kind and their authorization rules.

CREATE TABLE mqtt_credentials (
    id          uuid        PRIMARY KEY,
    name        text        NOT NULL UNIQUE,
    type        text        NOT NULL CHECK (type IN ('MQTT_BASIC', 'X509', 'JWT', 'SCRAM')),
    enabled     boolean     NOT NULL DEFAULT true,
    kind        text        NOT NULL CHECK (kind IN ('DEVICE', 'APPLICATION')),
    -- Lookup keys (services/common/auth/credentials.py: at most 1024 bytes each, so that
    -- the indexes below hold them).
    client_id   text        CHECK (octet_length(client_id) <= 1024),
    username    text        CHECK (octet_length(username) <= 1024),
    fingerprint text        CHECK (fingerprint ~ '^[0-9a-f]{64}$'),
    -- Ordered authorization rules: [{"permission", "action", "topic"}, ...].
    rules       jsonb       NOT NULL DEFAULT '[]',
    -- What the type needs besides its keys: password hash, certificate pattern, JWT
    -- settings (with their key), SCRAM secrets.
    details     jsonb       NOT NULL DEFAULT '{}',
    revision    bigint      NOT NULL DEFAULT 1,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX mqtt_credentials_username ON mqtt_credentials (username) WHERE username IS NOT NULL;
CREATE INDEX mqtt_credentials_client_id ON mqtt_credentials (client_id) WHERE client_id IS NOT NULL;
-- One MQTT_BASIC credential per (user name, client id) pair, one SCRAM credential per user
-- name, one X509 credential per certificate fingerprint.
CREATE UNIQUE INDEX mqtt_credentials_basic_identity ON mqtt_credentials
    (coalesce(username, ''), coalesce(client_id, '')) WHERE type = 'MQTT_BASIC';
CREATE UNIQUE INDEX mqtt_credentials_scram_username ON mqtt_credentials (username)
    WHERE type = 'SCRAM';
CREATE UNIQUE INDEX mqtt_credentials_fingerprint ON mqtt_credentials (fingerprint)
    WHERE fingerprint IS NOT NULL;

CREATE FUNCTION mqtt_credentials_revise() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.revision := OLD.revision + 1;
    NEW.updated_at := now();
    RETURN NEW;
END
$$;

CREATE TRIGGER mqtt_credentials_revise BEFORE UPDATE ON mqtt_credentials
    FOR EACH ROW EXECUTE FUNCTION mqtt_credentials_revise();

-- The lookup keys of a row as the ingest nodes' caches name them: SHA-256 (hex) of
-- 'u:' || user name, 'c:' || client id, 'f:' || fingerprint.
CREATE FUNCTION mqtt_credentials_keys(username text, client_id text, fingerprint text)
    RETURNS text[] LANGUAGE sql IMMUTABLE AS $$
    SELECT array_remove(ARRAY[
        encode(sha256(convert_to('u:' || username, 'UTF8')), 'hex'),
        encode(sha256(convert_to('c:' || client_id, 'UTF8')), 'hex'),
        encode(sha256(convert_to('f:' || fingerprint, 'UTF8')), 'hex')
    ], NULL)
$$;

-- Every change is announced on channel cormorant_credentials once committed (NOTIFY is
-- transactional), whoever made it: the CLI, the admin API or plain SQL.
CREATE FUNCTION mqtt_credentials_notify() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    keys  text[] := '{}';
    types text[] := '{}';
    ident uuid;
BEGIN
    IF TG_OP <> 'INSERT' THEN
        keys := keys || mqtt_credentials_keys(OLD.username, OLD.client_id, OLD.fingerprint);
        types := types || OLD.type;
        ident := OLD.id;
    END IF;
    IF TG_OP <> 'DELETE' THEN
        keys := keys || mqtt_credentials_keys(NEW.username, NEW.client_id, NEW.fingerprint);
        types := types || NEW.type;
        ident := NEW.id;
    END IF;
    PERFORM pg_notify('cormorant_credentials', json_build_object(
        'id', ident, 'op', TG_OP, 'types', types, 'keys', keys)::text);
    RETURN NULL;
END
$$;

CREATE TRIGGER mqtt_credentials_notify AFTER INSERT OR UPDATE OR DELETE ON mqtt_credentials
    FOR EACH ROW EXECUTE FUNCTION mqtt_credentials_notify();
