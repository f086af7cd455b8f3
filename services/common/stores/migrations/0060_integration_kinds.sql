-- Integrations of every kind (services/common/integrations/model.py, IntegrationKind): a
-- Kafka topic of another cluster (kafka), an HTTP endpoint (webhook), another MQTT broker
-- (mqtt, the bridge). A webhook's signing secret is kept in secrets, like a SASL password.

ALTER TABLE integrations DROP CONSTRAINT integrations_kind_check;
ALTER TABLE integrations ADD CONSTRAINT integrations_kind_check
    CHECK (kind IN ('kafka', 'webhook', 'mqtt'));
