"""Who may connect and what they may touch: credentials, authentication and authorization.

One source of truth for every service and tool that deals with credentials (the ingest
nodes, ``cormorant credentials``, the admin API):

- :mod:`.credentials`: the credential model (MQTT_BASIC, X509, JWT, SCRAM) and its
  validation; :mod:`.authorize`: the ordered allow/deny rules and their pure matcher;
- :mod:`.passwords` (argon2id), :mod:`.jwt_auth` (PyJWT), :mod:`.scram` (RFC 5802/7677,
  sans-IO), :mod:`.certificates` (the X509 lookup): the checks of each credential type;
- :mod:`.store` (PostgreSQL, with change notifications), :mod:`.cache` (an ingest node's
  cache, emptied by those notifications), :mod:`.authenticate` (the entry point an ingest
  node calls for every CONNECT and AUTH), :mod:`.manage` (add, list, show, update, enable,
  disable, delete: what the CLI and the admin API call);
- :mod:`.blocked` (blocked clients and flapping detection, sans-IO: refused before any
  check above), :mod:`.blocked_store` (their table, followed on the store's notification
  connection: ``cormorant blocked`` and the admin API manage them);
- :mod:`.http_provider` (an operator's HTTP endpoint asked about each CONNECT before the
  stored credentials), :mod:`.api_keys` (the keys of the HTTP publish API, their table).
"""
