"""KServe v2 gRPC (``inference.GRPCInferenceService``) over the engine's data plane.

The handlers translate protobuf messages to data-plane calls and back, exactly as the HTTP
routes do for JSON, so the two transports cannot disagree: an inference is decoded into the
engine's ``InferenceRequest`` (its tensors built by the same checked builder HTTP uses, so a
shape numpy cannot hold is INVALID_ARGUMENT with HTTP's message), answered by one
``DataPlane.infer`` call and encoded back. Tensors travel as
``raw_input_contents`` / ``raw_output_contents`` (what ``tritonclient.grpc`` sends), as typed
``contents``, or in a registered shared memory region. Needs the optional ``[grpc]`` extra
(grpcio); the messages are ``proto/inference.proto`` compiled by ``scripts/gen_grpc.sh``.

Auth follows the HTTP rule (``api.auth``): the Unix socket and a loopback-only listener need no
token; a TCP listener on any other address needs ``authorization: Bearer <[server] token>``
metadata. A ``ServingError`` becomes the gRPC status that matches its HTTP status.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from google.protobuf import json_format
from google.protobuf.message import Message

from edgeagent.api import v2
from edgeagent.api.auth import presented_token, scope_problem
from edgeagent.api.grpc.proto import inference_pb2 as pb
from edgeagent.api.grpc.settings import GrpcSettings
from edgeagent.api.grpc.tls import server_credentials
from edgeagent.api.settings import ServerSettings
from edgeagent.api.shm.callers import grpc_caller
from edgeagent.api.shm.regions import Caller, CallerRegions, SharedMemoryRegistry, shm_ref
from edgeagent.engine.dataplane import DataPlane
from edgeagent.engine.errors import InvalidInput, ServingError
from edgeagent.engine.requests import (
    InferenceResponse,
    datatype_of,
    numpy_dtype,
    tensor_from_buffer,
    tensor_from_values,
)
from edgeagent.tls import ServerTls

log = logging.getLogger(__name__)

SERVICE = "inference.GRPCInferenceService"

# The gRPC status for each HTTP status a ServingError carries (anything else: INTERNAL).
STATUS_CODES = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}

# Typed ``contents`` field for each v2 datatype (raw contents are what clients normally send).
_CONTENTS = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
}

Handler = Callable[[Any, grpc.aio.ServicerContext], Awaitable[Message]]


def _parameters(entries: Mapping[str, pb.InferParameter]) -> dict[str, Any]:
    """A protobuf parameter map as the plain values the codec and data plane read."""
    values: dict[str, Any] = {}
    for key, parameter in entries.items():
        choice = parameter.WhichOneof("parameter_choice")
        values[key] = getattr(parameter, choice) if choice else None
    return values


def _version(value: str) -> str | None:
    return value or None


# ---------------------------------------------------------------------------------------------
# Tensors


def _typed_contents(
    tensor: pb.ModelInferRequest.InferInputTensor, shape: list[int], where: str
) -> np.ndarray:
    field = _CONTENTS.get(tensor.datatype)
    if field is None:
        numpy_dtype(tensor.datatype, where)  # an unknown datatype is named as such first
        raise InvalidInput(f"{where}: {tensor.datatype} cannot travel in typed contents; use raw")
    return tensor_from_values(getattr(tensor.contents, field), shape, tensor.datatype, where)


def decode_inputs(request: pb.ModelInferRequest, regions: CallerRegions) -> dict[str, np.ndarray]:
    """The request's tensors: raw contents (one per input, in order), typed contents, or shm."""
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise InvalidInput(
            f"raw_input_contents has {len(raw)} entries but the request has "
            f"{len(request.inputs)} inputs"
        )
    tensors: dict[str, np.ndarray] = {}
    for index, tensor in enumerate(request.inputs):
        where = f"input {tensor.name!r}"
        if tensor.name in tensors:
            raise InvalidInput(f"{where} appears twice")
        shape = list(tensor.shape)
        ref = shm_ref(_parameters(tensor.parameters), where)
        if ref is not None:
            tensors[tensor.name] = v2.tensor_from_region(
                ref, shape, tensor.datatype, regions, where
            )
        elif raw:
            tensors[tensor.name] = tensor_from_buffer(raw[index], shape, tensor.datatype, where)
        else:
            tensors[tensor.name] = _typed_contents(tensor, shape, where)
    return tensors


def decode_request(
    request: pb.ModelInferRequest, context: grpc.aio.ServicerContext, regions: CallerRegions
) -> v2.WireRequest:
    """The engine's request, with the client's gRPC deadline and where each output goes (raw
    contents unless a shared memory region is named)."""
    placements: dict[str, v2.Placement] = {}
    for output in request.outputs:
        ref = shm_ref(_parameters(output.parameters), f"output {output.name!r}")
        if ref is not None:
            placements[output.name] = ref
    return v2.WireRequest(
        inputs=decode_inputs(request, regions),
        id=request.id or None,
        parameters=_parameters(request.parameters),
        outputs=[output.name for output in request.outputs] or None,
        deadline_s=context.time_remaining(),
        placements=placements,
        binary_output=True,
    )


def encode_response(
    answer: InferenceResponse, request: v2.WireRequest, regions: CallerRegions
) -> pb.ModelInferResponse:
    """The protobuf answer: each output's raw contents, in order, or the parameters of the
    shared memory region it was written into."""
    response = pb.ModelInferResponse(
        model_name=answer.model_name, model_version=answer.model_version, id=answer.id or ""
    )
    for name, array in answer.outputs.items():
        output = response.outputs.add(
            name=name, datatype=datatype_of(array.dtype), shape=array.shape
        )
        placement = request.placement(name)
        if isinstance(placement, v2.SharedMemoryRef):
            written = v2.write_to_region(array, placement, regions, f"output {name!r}")
            for key, value in written.items():
                parameter = output.parameters[key]
                if isinstance(value, str):
                    parameter.string_param = value
                else:
                    parameter.int64_param = value
        else:
            response.raw_output_contents.append(v2.tensor_to_bytes(array))
    return response


# ---------------------------------------------------------------------------------------------
# The service


class InferenceService:
    """The handlers of ``GRPCInferenceService``; each one a data-plane call."""

    def __init__(
        self, dataplane: DataPlane, regions: SharedMemoryRegistry, socket_mode: int
    ) -> None:
        """``socket_mode`` is the gRPC socket's: it says who a Unix-socket caller may be."""
        self.dataplane = dataplane
        self.regions = regions
        self.socket_mode = socket_mode

    async def ServerLive(self, request, context) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request, context) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.dataplane.ready())

    async def ModelReady(self, request, context) -> pb.ModelReadyResponse:
        ready = self.dataplane.model_ready(request.name, _version(request.version))
        return pb.ModelReadyResponse(ready=ready)

    async def ServerMetadata(self, request, context) -> pb.ServerMetadataResponse:
        return json_format.ParseDict(self.dataplane.server_metadata(), pb.ServerMetadataResponse())

    async def ModelMetadata(self, request, context) -> pb.ModelMetadataResponse:
        meta = self.dataplane.model_metadata(request.name, _version(request.version))
        return json_format.ParseDict(meta, pb.ModelMetadataResponse())

    async def ModelConfig(self, request, context) -> pb.ModelConfigResponse:
        config = self.dataplane.model_config(request.name, _version(request.version))
        versions = config.get("version_policy", {}).get("specific", {}).get("versions", [])
        if not all(str(v).isdigit() for v in versions):
            del config["version_policy"]  # the protocol's versions are integers; ours may not be
        message = pb.ModelConfigResponse()
        json_format.ParseDict(config, message.config, ignore_unknown_fields=True)
        return message

    async def ModelStatistics(self, request, context) -> pb.ModelStatisticsResponse:
        stats = self.dataplane.statistics(request.name or None, _version(request.version))
        return json_format.ParseDict({"model_stats": stats}, pb.ModelStatisticsResponse())

    async def RepositoryIndex(self, request, context) -> pb.RepositoryIndexResponse:
        rows = self.dataplane.repository_index(request.ready)
        return json_format.ParseDict({"models": rows}, pb.RepositoryIndexResponse())

    async def RepositoryModelLoad(self, request, context) -> pb.RepositoryModelLoadResponse:
        await self.dataplane.load(request.model_name)
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(self, request, context) -> pb.RepositoryModelUnloadResponse:
        await self.dataplane.unload(request.model_name)
        return pb.RepositoryModelUnloadResponse()

    def caller(self, context: grpc.aio.ServicerContext) -> Caller:
        """Who calls, for the shared memory regions it may see (``api.shm.callers``)."""
        return grpc_caller(context.peer(), context.invocation_metadata(), self.socket_mode)

    async def SystemSharedMemoryStatus(self, request, context):
        response = pb.SystemSharedMemoryStatusResponse()
        for region in self.regions.status(self.caller(context), request.name or None):
            json_format.ParseDict(region, response.regions[region["name"]])
        return response

    async def SystemSharedMemoryRegister(self, request, context):
        self.regions.register(
            self.caller(context), request.name, request.key, request.offset, request.byte_size
        )
        return pb.SystemSharedMemoryRegisterResponse()

    async def SystemSharedMemoryUnregister(self, request, context):
        self.regions.unregister(self.caller(context), request.name or None)
        return pb.SystemSharedMemoryUnregisterResponse()

    async def ModelInfer(self, request, context) -> pb.ModelInferResponse:
        regions = self.regions.of(lambda: self.caller(context))
        decoded = decode_request(request, context, regions)
        version = _version(request.model_version)
        answer = await self.dataplane.infer(decoded, request.model_name, version)
        return encode_response(answer, decoded, regions)


# ---------------------------------------------------------------------------------------------
# Errors, auth and the server


# The calls that change what is served take the admin scope, as their HTTP routes do.
ADMIN_METHODS = frozenset({"RepositoryModelLoad", "RepositoryModelUnload"})


def _guarded(handler: Handler, admin: bool, server: ServerSettings):
    """``handler`` behind HTTP's token rule (TCP only), ServingErrors as gRPC statuses."""

    async def call(request: Any, context: grpc.aio.ServicerContext) -> Message:
        if not context.peer().startswith("unix:"):  # the socket's permissions guard it
            metadata = dict(context.invocation_metadata() or ())
            header = metadata.get("authorization")
            presented = presented_token(header if isinstance(header, str) else None)
            problem = scope_problem(presented, admin, server)
            if problem is not None:
                status, message = problem
                code = (
                    grpc.StatusCode.UNAUTHENTICATED
                    if status == 401
                    else grpc.StatusCode.PERMISSION_DENIED
                )
                await context.abort(code, message)
        try:
            return await handler(request, context)
        except ServingError as exc:
            code = STATUS_CODES.get(exc.status, grpc.StatusCode.INTERNAL)
            await context.abort(code, exc.message)
        except Exception as exc:
            log.exception("internal error in %s", getattr(handler, "__name__", handler))
            await context.abort(
                grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}: {exc}"
            )
        raise AssertionError("unreachable: abort raises")  # pragma: no cover

    return call


def _serialize(message: Message) -> bytes:
    return message.SerializeToString()


_MESSAGES: dict[str, type[Message]] = {
    "ServerLive": pb.ServerLiveRequest,
    "ServerReady": pb.ServerReadyRequest,
    "ModelReady": pb.ModelReadyRequest,
    "ServerMetadata": pb.ServerMetadataRequest,
    "ModelMetadata": pb.ModelMetadataRequest,
    "ModelInfer": pb.ModelInferRequest,
    "ModelConfig": pb.ModelConfigRequest,
    "ModelStatistics": pb.ModelStatisticsRequest,
    "RepositoryIndex": pb.RepositoryIndexRequest,
    "RepositoryModelLoad": pb.RepositoryModelLoadRequest,
    "RepositoryModelUnload": pb.RepositoryModelUnloadRequest,
    "SystemSharedMemoryStatus": pb.SystemSharedMemoryStatusRequest,
    "SystemSharedMemoryRegister": pb.SystemSharedMemoryRegisterRequest,
    "SystemSharedMemoryUnregister": pb.SystemSharedMemoryUnregisterRequest,
}


class GrpcServer:
    """The gRPC listener(s) of one daemon: TCP ``host:port`` and/or the Unix socket."""

    def __init__(
        self,
        dataplane: DataPlane,
        settings: GrpcSettings,
        *,
        server: ServerSettings,
        regions: SharedMemoryRegistry,
        tcp_port: int | None = None,
        tls: ServerTls | None = None,
    ) -> None:
        """``tcp_port`` overrides ``settings.port`` (0 there: an ephemeral port, for tests);
        ``tls``: the TCP port serves TLS with that certificate (the Unix socket never does)."""
        self.settings = settings
        self.tls = tls
        self._bind_tcp = settings.port != 0 or tcp_port is not None
        self._tcp_port = settings.port if tcp_port is None else tcp_port
        self.server = server
        self.service = InferenceService(dataplane, regions, settings.socket_mode)
        self.port: int | None = None  # the bound TCP port once started (for port 0)
        self._server: grpc.aio.Server | None = None

    def _handlers(self) -> grpc.GenericRpcHandler:
        methods = {
            name: grpc.unary_unary_rpc_method_handler(
                _guarded(getattr(self.service, name), name in ADMIN_METHODS, self.server),
                request_deserializer=message.FromString,
                response_serializer=_serialize,
            )
            for name, message in _MESSAGES.items()
        }
        return grpc.method_handlers_generic_handler(SERVICE, methods)

    async def start(self) -> list[str]:
        """Bind and start; returns where it listens (``grpc://host:port``, ``unix:path``)."""
        limit = self.settings.max_message_bytes
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", limit),
                ("grpc.max_send_message_length", limit),
                ("grpc.so_reuseport", 0),
            ],
            maximum_concurrent_rpcs=self.settings.max_concurrent_rpcs,
        )
        server.add_generic_rpc_handlers((self._handlers(),))
        listening = []
        if self._bind_tcp:
            host = f"[{self.settings.host}]" if ":" in self.settings.host else self.settings.host
            address = f"{host}:{self._tcp_port}"
            if self.tls is None:
                self.port = server.add_insecure_port(address)
            else:
                self.port = server.add_secure_port(address, server_credentials(self.tls))
            listening.append(f"grpc{'s' if self.tls else ''}://{host}:{self.port}")
        path = self.settings.unix_socket
        if path is not None:
            Path(path).parent.mkdir(parents=True, exist_ok=True, mode=0o750)
            with contextlib.suppress(FileNotFoundError):
                Path(path).unlink()  # gRPC refuses to bind over a stale socket
            server.add_insecure_port(f"unix:{path}")
            listening.append(f"unix:{path}")
        await server.start()
        if path is not None:
            os.chmod(path, self.settings.socket_mode)
        self._server = server
        return listening

    async def stop(self, grace_s: float) -> None:
        """Stop accepting, let calls in flight finish within ``grace_s``, remove the socket."""
        if self._server is not None:
            await self._server.stop(grace_s)
            self._server = None
        if self.settings.unix_socket is not None:
            with contextlib.suppress(FileNotFoundError):
                Path(self.settings.unix_socket).unlink()
