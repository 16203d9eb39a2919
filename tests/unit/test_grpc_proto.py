"""edgeagent's inference.proto speaks the protocol's wire format: same numbers, same types.

Protobuf messages carry only field numbers and wire types, so a stock client works exactly when
every field edgeagent declares has the number, type and cardinality of the protocol's own
(here: tritonclient's compiled grpc_service.proto and model_config.proto).
"""

from __future__ import annotations

import pytest
from google.protobuf.descriptor import Descriptor
from tritonclient.grpc import model_config_pb2, service_pb2

from edgeagent.api.grpc.proto import inference_pb2
from edgeagent.api.grpc.server import _MESSAGES, SERVICE

OURS = inference_pb2.DESCRIPTOR


def theirs(name: str) -> Descriptor:
    for module in (service_pb2, model_config_pb2):
        if name in module.DESCRIPTOR.message_types_by_name:
            return module.DESCRIPTOR.message_types_by_name[name]
    raise AssertionError(f"the protocol has no message {name}")


def mismatches(mine: Descriptor, reference: Descriptor, path: str) -> list[str]:
    problems = []
    for field in mine.fields:
        other = reference.fields_by_number.get(field.number)
        where = f"{path}.{field.name} = {field.number}"
        if other is None:
            problems.append(f"{where}: no such field number in the protocol")
            continue
        if (field.name, field.type, field.is_repeated) != (
            other.name,
            other.type,
            other.is_repeated,
        ):
            problems.append(f"{where}: the protocol has {other.name} type {other.type}")
        if field.message_type is not None and other.message_type is not None:
            problems += mismatches(field.message_type, other.message_type, where)
    return problems


@pytest.mark.parametrize("name", sorted(OURS.message_types_by_name))
def test_every_message_matches_the_protocol(name: str) -> None:
    assert mismatches(OURS.message_types_by_name[name], theirs(name), name) == []


def test_the_service_serves_the_protocols_methods_with_its_messages() -> None:
    service = service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    assert service.full_name == SERVICE
    for method, request in _MESSAGES.items():
        protocol = service.methods_by_name[method]
        assert protocol.input_type.name == request.DESCRIPTOR.name
        ours = OURS.services_by_name["GRPCInferenceService"].methods_by_name[method]
        assert ours.output_type.name == protocol.output_type.name


def test_the_comparison_catches_a_wrong_number() -> None:
    """The check itself can fail: a message against a different one of the protocol's."""
    assert mismatches(
        OURS.message_types_by_name["ModelReadyRequest"], theirs("ServerLiveResponse"), "x"
    )
