"""``edgeagent hub server``: the fleet manager as a long-running service.

It keeps what the one-shot hub commands forget — every device's last report, an event history,
and deployments as durable rows — in a database (SQLite by default, PostgreSQL for large
fleets), drives staged rollouts from those rows (so a restart resumes them), and answers a REST
API. Modules: ``settings`` (flags and limits), ``schema`` + ``migrations`` (tables, Alembic),
``database`` (engine, upgrade on start), ``reports`` (parsing device messages), ``ingest``
(MQTT → database), ``fleetdb`` and ``deploydb`` (queries), ``controller`` (the rollout state
machine), ``api`` + ``auth`` + ``openapi.yaml`` (REST), ``service`` (composition), ``client``
(what ``hub status/rollout --server`` use).
"""
