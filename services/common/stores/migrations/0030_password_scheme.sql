-- How each MQTT_BASIC credential's password is hashed (services/common/auth/passwords.py):
-- 'argon2id' for a password someone chose, 'hmac-sha256' for a secret the server generated
-- (cormorant credentials add --generate-secret). NULL: no password. The stored hash names
-- its scheme too (its first $-field); the constraint keeps the two in agreement.

ALTER TABLE mqtt_credentials ADD COLUMN password_scheme text
    CHECK (password_scheme IN ('argon2id', 'hmac-sha256'));

UPDATE mqtt_credentials
    SET password_scheme = substring(details->>'password_hash' FROM '^\$([a-z0-9-]+)\$')
    WHERE details ? 'password_hash';

ALTER TABLE mqtt_credentials ADD CONSTRAINT mqtt_credentials_password_scheme CHECK (
    (password_scheme IS NULL AND NOT details ? 'password_hash')
    OR details->>'password_hash' LIKE '$' || password_scheme || '$%'
);
