"""``edgeagent hub server``: the fleet manager as a long-running service.

It keeps what the one-shot hub commands forget — every device's last report, an event history,
and deployments as durable rows — in a database (SQLite by default, PostgreSQL for large
fleets), drives staged rollouts from those rows (so a restart resumes them), and answers a REST
API. Modules: ``settings`` (flags and limits), ``schema`` + ``migrations`` (tables, Alembic),
``database`` (engine, upgrade on start), ``reports`` (parsing device messages), ``ingest``
(MQTT → database), ``fleetdb`` (devices), ``releasedb`` (releases, serials), ``targets`` (who a
deployment is for), ``deploydb`` (the one writer of deployment state: every move a named
transition) and ``deployreads`` (its reads), ``controller`` (decides each rollout's next move)
and ``cancel`` (what an abort sends), ``api`` + ``auth`` + ``openapi.yaml`` (REST),
``dashboard/`` (the pages), ``service`` (composition), ``client`` (what ``hub status/rollout
--server`` use).
"""
