"""Detection through the HTTP API: the agent's route and DeepStack's, as Frigate calls it.

The served model is a real ONNX graph whose YOLO-style output rows are fixed (hand-computed
boxes in its 64×64 input), so every box the API returns can be checked to the pixel through
the letterbox mapping, the score threshold and NMS.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import requests

from tests.support.http_agent import TOKEN, AgentServer
from tests.support.toy_detector import CAT, DOG, detector_agent, image_bytes


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentServer]:
    with detector_agent(tmp_path_factory.mktemp("detect")) as server:
        yield server


def tcp(agent: AgentServer, method: str, path: str, **options) -> requests.Response:
    return requests.request(method, agent.url + path, timeout=30, **options)


def bearer() -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKEN}"}


def test_detect_maps_boxes_through_the_letterbox_and_applies_nms(agent: AgentServer) -> None:
    response = tcp(
        agent,
        "POST",
        "/v1/models/toy/detect",
        data=image_bytes(),
        headers={**bearer(), "Content-Type": "image/png"},
    )
    assert response.status_code == 200, response.text
    answer = response.json()
    assert [d["label"] for d in answer["detections"]] == ["cat", "dog"]
    np.testing.assert_allclose(answer["detections"][0]["box"], CAT, atol=0.01)
    np.testing.assert_allclose(answer["detections"][1]["box"], DOG, atol=0.01)
    assert answer["detections"][0]["score"] == pytest.approx(0.9)
    assert answer["image_size"] == [128, 64] and answer["backend"] == "onnxruntime"


def test_min_score_raises_the_threshold_for_one_request(agent: AgentServer) -> None:
    response = tcp(
        agent, "POST", "/v1/models/toy/detect?min_score=0.7", data=image_bytes(), headers=bearer()
    )
    assert [d["label"] for d in response.json()["detections"]] == ["cat"]
    bad = tcp(
        agent, "POST", "/v1/models/toy/detect?min_score=2", data=image_bytes(), headers=bearer()
    )
    assert bad.status_code == 400 and "min_score" in bad.json()["error"]


def test_a_classifier_is_not_a_detector(agent: AgentServer) -> None:
    response = tcp(agent, "POST", "/v1/models/tiny/detect", data=image_bytes(), headers=bearer())
    assert response.status_code == 400 and "is not a detector" in response.json()["error"]


def frigate_post(agent: AgentServer, api_key: str, jpeg: bytes) -> requests.Response:
    """The request exactly as Frigate's deepstack detector plugin builds it: the frame as JPEG
    in a multipart field ``image``, ``api_key`` as a form field, requests' defaults otherwise."""
    return requests.post(
        agent.url + "/v1/vision/detection",
        data={"api_key": api_key},
        files={"image": jpeg},
        timeout=30,
    )


def test_frigate_deepstack_request_is_answered_in_deepstacks_shape(agent: AgentServer) -> None:
    response = frigate_post(agent, TOKEN, image_bytes("JPEG"))
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["success"] is True and answer["duration"] >= 0
    predictions = answer["predictions"]
    assert [p["label"] for p in predictions] == ["cat", "dog"]
    confidences = [p["confidence"] for p in predictions]
    assert confidences == sorted(confidences, reverse=True)  # Frigate stops at the first < 0.4
    cat = predictions[0]
    assert [cat["x_min"], cat["y_min"], cat["x_max"], cat["y_max"]] == [44, 22, 84, 42]
    assert all(isinstance(cat[k], int) for k in ("x_min", "y_min", "x_max", "y_max"))


def test_deepstack_min_confidence_and_errors_keep_deepstacks_shape(agent: AgentServer) -> None:
    response = requests.post(
        agent.url + "/v1/vision/detection",
        data={"api_key": TOKEN, "min_confidence": "0.7"},
        files={"image": image_bytes("JPEG")},
        timeout=30,
    )
    assert [p["label"] for p in response.json()["predictions"]] == ["cat"]
    refused = frigate_post(agent, "wrong", image_bytes("JPEG"))
    assert refused.status_code == 401
    assert refused.json()["success"] is False and refused.json()["error"] == "Incorrect api key"
    broken = frigate_post(agent, TOKEN, b"\xff\xd8 not a jpeg")
    assert broken.status_code == 400 and broken.json()["success"] is False
    no_image = requests.post(
        agent.url + "/v1/vision/detection",
        data={"api_key": TOKEN},
        files={"picture": image_bytes("JPEG")},  # the wrong field name
        timeout=30,
    )
    assert no_image.status_code == 400 and no_image.json()["success"] is False


def test_a_cross_site_form_without_the_token_is_refused(agent: AgentServer) -> None:
    """The form route lets multipart through the browser guard only because it needs the
    token: a page on another site can post the form but cannot know the token."""
    response = requests.post(
        agent.url + "/v1/vision/detection",
        files={"image": image_bytes("JPEG")},
        headers={"Origin": agent.url},
        timeout=30,
    )
    assert response.status_code == 401 and response.json()["success"] is False


def test_detections_are_counted_per_model(agent: AgentServer) -> None:
    frigate_post(agent, TOKEN, image_bytes("JPEG"))
    text = tcp(agent, "GET", "/metrics", headers=bearer()).text
    line = next(
        x for x in text.splitlines() if x.startswith('edgeagent_detections_total{model="toy"}')
    )
    assert float(line.split()[-1]) >= 2
