-- The admin service's users, their bearer tokens and the audit trail (services/admin/users.py).

CREATE TABLE admin_users (
    username      text        PRIMARY KEY CHECK (username ~ '^[A-Za-z0-9._@-]{1,64}$'),
    -- argon2id, in the PHC string format argon2-cffi writes ($argon2id$v=19$m=...,t=...,p=...$...)
    password_hash text        NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now()
);

-- A token is kept as its SHA-256 only: a copy of this table logs nobody in.
CREATE TABLE admin_tokens (
    token_hash bytea       PRIMARY KEY CHECK (length(token_hash) = 32),
    username   text        NOT NULL REFERENCES admin_users (username) ON DELETE CASCADE,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL
);
CREATE INDEX admin_tokens_expires_at ON admin_tokens (expires_at);

-- Every mutating call of the admin API: who, what, on what, when, and its HTTP status.
CREATE TABLE admin_audit (
    id       bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at       timestamptz NOT NULL DEFAULT now(),
    username text        NOT NULL,
    action   text        NOT NULL,
    target   text        NOT NULL,
    detail   jsonb       NOT NULL DEFAULT '{}',
    status   integer     NOT NULL
);
CREATE INDEX admin_audit_at ON admin_audit (at DESC);
