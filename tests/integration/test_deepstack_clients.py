"""DeepStack's API as its users' own client libraries call it, unchanged (issue 25).

``deepstack-python`` 0.9 is what Home Assistant's DeepStack integration runs
(``DeepstackObject``, with ``custom_model`` for custom models); ``deepstack-sdk`` 0.2.1 is the
DeepStack project's SDK (``Detection(config, name=…)``). Both post the frame as multipart
``image`` with ``api_key`` and ``min_confidence`` form fields. The served detector is the toy
whose rows are known to the pixel (``tests/support/toy_detector.py``): cat 0.9, dog 0.6, and a
cat at 0.2 that only a ``min_confidence`` below the package's threshold (0.3) lets through.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import requests
from deepstack.core import DeepstackException, DeepstackObject
from deepstack_sdk import Detection, ServerConfig

from tests.support.http_agent import ADMIN_TOKEN, TOKEN, AgentServer
from tests.support.toy_detector import detector_agent, image_bytes


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentServer]:
    with detector_agent(tmp_path_factory.mktemp("deepstack")) as server:
        yield server


def _home_assistant(agent: AgentServer, **options) -> DeepstackObject:
    where = urlsplit(agent.url)
    return DeepstackObject(where.hostname, where.port, timeout=30, **options)


def test_home_assistants_client_gets_boxes_down_to_its_min_confidence(agent: AgentServer) -> None:
    default = _home_assistant(agent, api_key=TOKEN, min_confidence=0.4).detect(image_bytes())
    assert [p["label"] for p in default] == ["cat", "dog"]
    # Home Assistant sends 0.1: the 0.2 row, below the package's own 0.3, comes too
    low = _home_assistant(agent, api_key=TOKEN, min_confidence=0.1).detect(image_bytes())
    confidences = [p["confidence"] for p in low]
    assert confidences == pytest.approx([0.9, 0.6, 0.2])


def test_home_assistants_custom_model_is_served(agent: AgentServer) -> None:
    custom = _home_assistant(agent, api_key=TOKEN, min_confidence=0.4, custom_model="toy")
    assert [p["label"] for p in custom.detect(image_bytes())] == ["cat", "dog"]
    unknown = _home_assistant(agent, api_key=TOKEN, custom_model="nothing")
    with pytest.raises(DeepstackException, match="404"):
        unknown.detect(image_bytes())


def test_home_assistants_client_with_a_wrong_key_is_refused(agent: AgentServer) -> None:
    with pytest.raises(DeepstackException, match="401"):
        _home_assistant(agent, api_key="wrong").detect(image_bytes())


def test_the_deepstack_sdk_detects_with_the_default_and_a_custom_model(
    agent: AgentServer,
) -> None:
    config = ServerConfig(agent.url, api_key=TOKEN)
    for detection in (Detection(config), Detection(config, name="toy")):
        found = detection.detectObject(image_bytes("JPEG"), min_confidence=0.4)
        assert [(d.label, d.x_min, d.y_min, d.x_max, d.y_max) for d in found] == [
            ("cat", 44, 22, 84, 42),
            ("dog", 12, 40, 28, 56),
        ]


def _form(agent: AgentServer, path: str, **fields: str) -> requests.Response:
    return requests.post(
        agent.url + path, data=fields, files={"image": image_bytes("JPEG")}, timeout=30
    )


def test_answers_carry_codeproject_ais_fields_and_deepstacks_messages(agent: AgentServer) -> None:
    answer = _form(agent, "/v1/vision/custom/toy", api_key=TOKEN).json()
    assert answer["success"] is True and answer["count"] == 2 == len(answer["predictions"])
    assert answer["message"] == "Found cat, dog" and answer["moduleId"] == "edgeagent"
    assert answer["inferenceMs"] >= 0 and answer["processMs"] >= answer["inferenceMs"]
    wrong = _form(agent, "/v1/vision/detection", api_key="wrong")
    assert wrong.status_code == 401 and wrong.json()["error"] == "Incorrect api key"
    missing = _form(agent, "/v1/vision/detection").json()
    assert missing["success"] is False and "api_key field" in missing["error"]
    assert missing["code"] == 401
    classifier = _form(agent, "/v1/vision/custom/tiny", api_key=TOKEN)
    assert classifier.status_code == 404 and classifier.json()["success"] is False


def test_the_model_list_names_the_served_detectors(agent: AgentServer) -> None:
    listed = requests.post(
        agent.url + "/v1/vision/custom/list", data={"api_key": TOKEN}, timeout=30
    )
    assert listed.status_code == 200, listed.text
    assert listed.json()["models"] == ["toy"]  # the classifier cannot answer detection
    refused = requests.post(agent.url + "/v1/vision/custom/list", timeout=30)
    assert refused.status_code == 401 and refused.json()["success"] is False


def test_a_host_the_listener_does_not_know_is_refused_in_deepstacks_shape(
    agent: AgentServer,
) -> None:
    response = requests.post(
        agent.url + "/v1/vision/detection",
        data={"api_key": TOKEN},
        files={"image": image_bytes("JPEG")},
        headers={"Host": "edgeagent-nvr:8000"},  # a Compose service name not in allowed_hosts
        timeout=30,
    )
    assert response.status_code == 403
    assert response.json()["success"] is False and "allowed_hosts" in response.json()["error"]


def test_predictions_are_capped_for_frigates_fixed_array(tmp_path: Path) -> None:
    with detector_agent(tmp_path, deepstack_max_predictions=1) as server:
        answer = _form(server, "/v1/vision/detection", api_key=TOKEN, min_confidence="0.1").json()
    assert [p["label"] for p in answer["predictions"]] == ["cat"]  # the best one only


def test_without_a_deepstack_model_the_endpoint_is_not_activated(tmp_path: Path) -> None:
    with detector_agent(tmp_path, deepstack_model="") as server:
        response = _form(server, "/v1/vision/detection", api_key=TOKEN)
        custom = _form(server, "/v1/vision/custom/toy", api_key=TOKEN)  # still served by name
    assert response.status_code == 403
    assert response.json()["error"].startswith("Detection endpoint not activated")
    assert custom.status_code == 200 and custom.json()["count"] == 2


def test_a_detector_that_is_not_ready_is_a_retry_not_a_missing_endpoint(tmp_path: Path) -> None:
    """While the configured detector is unloaded (or loading), Frigate must see 503 (the
    dataplane's answer, a retry), not 403 'not activated' or 404 'not served'."""
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    with detector_agent(tmp_path) as server:
        unload = requests.post(server.url + "/v2/repository/models/toy/unload", headers=admin)
        assert unload.status_code == 200, unload.text
        for path in ("/v1/vision/detection", "/v1/vision/custom/toy"):
            response = _form(server, path, api_key=TOKEN)
            assert response.status_code == 503, (path, response.text)
            assert response.json()["success"] is False
        load = requests.post(server.url + "/v2/repository/models/toy/load", headers=admin)
        assert load.status_code == 200, load.text
        assert _form(server, "/v1/vision/detection", api_key=TOKEN).json()["count"] == 2
