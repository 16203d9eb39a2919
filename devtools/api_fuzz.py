"""Fuzz a running agent from its own OpenAPI document with schemathesis, so every route keeps
being attacked with what its schema allows and what it forbids; shared by
``tests/integration/test_http_fuzz.py`` and ``scripts/fuzz_api.py``.

For every operation and both of schemathesis's generation modes (requests that follow the
document, and requests that break it), hypothesis draws ``examples`` requests and each is sent
to the daemon over loopback TCP. A *server error* is any 5xx except the documented
back-pressure answers (503 with ``Retry-After``) and 504, the deadline a client may ask for.

The model name in paths is pinned to the served model so bodies reach the codec and the engine
rather than the 404. The user token is sent, so repository load/unload answer 403 and the
fuzzer cannot unload the model that every later request needs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.config import SchemathesisConfig
from schemathesis.core.failures import FailureGroup

from edgeagent.api.http.edge_routes import openapi_document

MODES = (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE)
# What rejects a request that breaks the document: schemathesis's own list, and 413, the body
# limit (the agent's max_body_bytes, the hub's --max-body-bytes) refusing an oversized drawn
# body before its content is read — a rejection all the same, and the right one.
REJECTIONS = ["400", "401", "403", "404", "405", "406", "409", "413", "415", "422", "428", "429"]
FUZZ_CONFIG = SchemathesisConfig.from_dict(
    {"checks": {"negative_data_rejection": {"expected-statuses": [*REJECTIONS, "5xx"]}}}
)


@dataclass
class FuzzReport:
    """What the fuzzer sent and what came back."""

    examples: int = 0
    statuses: dict[int, int] = field(default_factory=dict)
    server_errors: list[str] = field(default_factory=list)
    mismatches: list[str] = field(default_factory=list)  # answers the document does not allow


def is_server_error(response: Any) -> bool:
    if response.status_code == 503 and "Retry-After" in response.headers:
        return False
    return response.status_code >= 500 and response.status_code != 504


def operations(document: dict[str, Any] | None = None) -> list[schemathesis.APIOperation]:
    """Every operation of ``document``; by default the one the agent serves
    (``edgeagent/api/http/openapi.yaml``)."""
    schema = schemathesis.openapi.from_dict(document or openapi_document(), config=FUZZ_CONFIG)
    return [result.ok() for result in schema.get_all_operations()]


def fuzz_operation(
    operation: schemathesis.APIOperation,
    base_url: str,
    headers: dict[str, str],
    examples: int,
    report: FuzzReport,
    derandomize: bool = True,
    model: str = "tiny",
    path_values: dict[str, Any] | None = None,
    checks: tuple[Any, ...] = (),
) -> None:
    """Send ``examples`` generated requests per mode for ``operation``; record the answers.

    ``path_values`` pins path parameters by name (default: ``name`` to ``model``); ``checks``
    are schemathesis checks each answer must pass (e.g. ``response_schema_conformance``).
    """
    names = {p.name for p in operation.path_parameters}
    wanted = {"name": model} if path_values is None else path_values
    pinned = {k: v for k, v in wanted.items() if k in names} or None
    session = requests.Session()
    for mode in MODES:
        try:
            _draw(
                operation,
                mode,
                pinned,
                base_url,
                session,
                headers,
                examples,
                report,
                derandomize,
                checks,
            )
        except Unsatisfiable:  # nothing in this operation can be made invalid (no inputs)
            if mode is not schemathesis.GenerationMode.NEGATIVE:
                raise
    session.close()


def _draw(
    operation: schemathesis.APIOperation,
    mode: schemathesis.GenerationMode,
    pinned: dict[str, str] | None,
    base_url: str,
    session: requests.Session,
    headers: dict[str, str],
    examples: int,
    report: FuzzReport,
    derandomize: bool,
    checks: tuple[Any, ...] = (),
) -> None:
    @given(case=operation.as_strategy(generation_mode=mode, path_parameters=pinned))
    @settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        derandomize=derandomize,
        database=None,
    )
    def send(case: schemathesis.Case) -> None:
        response = case.call(base_url=base_url, session=session, headers=headers, timeout=60)
        report.examples += 1
        report.statuses[response.status_code] = report.statuses.get(response.status_code, 0) + 1
        if is_server_error(response):
            report.server_errors.append(
                f"{case.method} {case.formatted_path} ({mode.value}) answered "
                f"{response.status_code}: {response.text[:300]}"
            )
        elif checks:
            try:
                case.validate_response(response, checks=list(checks))
            except FailureGroup as failure:  # one entry for each check that failed
                report.mismatches.append(
                    f"{case.method} {case.formatted_path} ({mode.value}) answered "
                    f"{response.status_code}: {str(failure)[:600]}"
                )

    send()
