"""The hub's dashboard: server-rendered pages over the same queries as the REST API.

``fleet_pages`` (the fleet table, a device's page, login, and the route table), ``deployment_pages``
with its reads (``deployment_queries``) and scripts (``scripts``), the shared page frame and
escaping (``markup``), and the inline SVG charts (``charts``).
"""
