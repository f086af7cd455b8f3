-- API keys of the HTTP publish API (services/common/auth/api_keys.py): a generated secret's
-- salted HMAC-SHA-256 only (services/common/auth/passwords.py), never the key itself.

CREATE TABLE http_api_keys (
    id          uuid        PRIMARY KEY,
    name        text        NOT NULL UNIQUE CHECK (octet_length(name) BETWEEN 1 AND 128),
    -- The Client Identifier its messages are published as (the msg.all record key).
    client_id   text        NOT NULL CHECK (octet_length(client_id) BETWEEN 1 AND 1024),
    rules       jsonb       NOT NULL DEFAULT '[]',
    key_hash    text        NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    created_by  text        NOT NULL DEFAULT ''
);
