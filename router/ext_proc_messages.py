"""The endpoint-picker protocol's names and Envoy ext-proc messages, built and read. Pure.

The Gateway API Inference Extension's endpoint-picker protocol
(docs/proposals/004-endpoint-picker-protocol of sigs.k8s.io/gateway-api-inference-extension):
the picker names the chosen pod as `<ip:port>` both in the `x-gateway-destination-endpoint`
request header and in the ext-proc response's dynamic metadata under `envoy.lb`, the same
value in both; the gateway may restrict the choice with
`envoy.lb.subset_hint/x-gateway-destination-endpoint-subset` in the request's filter
metadata; no Ready endpoint is an ImmediateResponse with 503. Messages are the
`envoy.service.ext_proc.v3` protos as gRPC's `xds-protos` package generates them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from urllib.parse import urlsplit

from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.type.v3 import http_status_pb2
from google.protobuf import struct_pb2

DESTINATION_HEADER = "x-gateway-destination-endpoint"
DESTINATION_NAMESPACE = "envoy.lb"
SUBSET_NAMESPACE = "envoy.lb.subset_hint"
SUBSET_KEY = "x-gateway-destination-endpoint-subset"
SERVED_KEY = "x-gateway-destination-endpoint-served"
# Envoy's ext-proc limits a streamed body message; the reference picker cuts at 62,000 bytes.
BODY_CHUNK_BYTES = 62_000

Mode = processing_mode_pb2.ProcessingMode
FULL_DUPLEX = Mode.FULL_DUPLEX_STREAMED
BUFFERED_MODES = frozenset({Mode.BUFFERED, Mode.BUFFERED_PARTIAL})


def endpoint_address(url: str) -> str:
    """`http://10.0.0.7:8000` -> `10.0.0.7:8000`, the protocol's `<ip:port>`."""
    return urlsplit(url).netloc


def request_body_mode(request: pb.ProcessingRequest) -> int | None:
    """The request body mode Envoy announces in a stream's first message (Envoy >= 1.33
    sends `protocol_config`); None when it does not say."""
    if not request.HasField("protocol_config"):
        return None
    return request.protocol_config.request_body_mode


def response_body_mode(request: pb.ProcessingRequest) -> int | None:
    if not request.HasField("protocol_config"):
        return None
    return request.protocol_config.response_body_mode


def subset_hint(request: pb.ProcessingRequest) -> frozenset[str] | None:
    """The endpoints the gateway allows (`ip:port` or a bare `ip`), or None when it set no
    hint. A list of strings or one comma-separated string, as the reference picker reads."""
    namespace = request.metadata_context.filter_metadata.get(SUBSET_NAMESPACE)
    if namespace is None or SUBSET_KEY not in namespace.fields:
        return None
    value = namespace.fields[SUBSET_KEY]
    kind = value.WhichOneof("kind")
    if kind == "string_value":
        items: Iterable[str] = [value.string_value]
    elif kind == "list_value":
        items = [v.string_value for v in value.list_value.values if v.HasField("string_value")]
    else:
        items = []
    return frozenset(part.strip() for item in items for part in item.split(",") if part.strip())


def in_subset(address: str, subset: frozenset[str]) -> bool:
    return address in subset or address.rsplit(":", 1)[0] in subset


def _set_headers(headers: dict[str, str]) -> pb.HeaderMutation:
    overwrite = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD
    return pb.HeaderMutation(set_headers=[
        base_pb2.HeaderValueOption(
            header=base_pb2.HeaderValue(key=k, raw_value=v.encode()), append_action=overwrite
        )
        for k, v in headers.items()
    ])  # fmt: skip


def _destination_metadata(address: str) -> struct_pb2.Struct:
    metadata = struct_pb2.Struct()
    metadata.update({DESTINATION_NAMESPACE: {DESTINATION_HEADER: address}})
    return metadata


def _destination(address: str) -> pb.CommonResponse:
    """Set the header (a client's own value is overwritten) and re-pick the route."""
    return pb.CommonResponse(
        header_mutation=_set_headers({DESTINATION_HEADER: address}), clear_route_cache=True
    )


def request_headers_with_endpoint(address: str) -> pb.ProcessingResponse:
    return pb.ProcessingResponse(
        request_headers=pb.HeadersResponse(response=_destination(address)),
        dynamic_metadata=_destination_metadata(address),
    )


def request_body_with_endpoint(address: str) -> pb.ProcessingResponse:
    """Buffered mode: the headers are still held by Envoy while it waits for this answer."""
    return pb.ProcessingResponse(
        request_body=pb.BodyResponse(response=_destination(address)),
        dynamic_metadata=_destination_metadata(address),
    )


def continue_request_headers() -> pb.ProcessingResponse:
    return pb.ProcessingResponse(request_headers=pb.HeadersResponse())


def continue_response_headers() -> pb.ProcessingResponse:
    return pb.ProcessingResponse(response_headers=pb.HeadersResponse())


def continue_request_body() -> pb.ProcessingResponse:
    return pb.ProcessingResponse(request_body=pb.BodyResponse())


def continue_response_body() -> pb.ProcessingResponse:
    return pb.ProcessingResponse(response_body=pb.BodyResponse())


def continue_trailers(request: pb.ProcessingRequest) -> pb.ProcessingResponse:
    if request.HasField("request_trailers"):
        return pb.ProcessingResponse(request_trailers=pb.TrailersResponse())
    return pb.ProcessingResponse(response_trailers=pb.TrailersResponse())


def _streamed(body: bytes, end_of_stream: bool) -> pb.BodyResponse:
    return pb.BodyResponse(response=pb.CommonResponse(body_mutation=pb.BodyMutation(
        streamed_response=pb.StreamedBodyResponse(body=body, end_of_stream=end_of_stream)
    )))  # fmt: skip


def streamed_request_body(body: bytes) -> list[pb.ProcessingResponse]:
    """Full-duplex mode: the picker sends the whole body back (unchanged), in chunks."""
    chunks = [body[i : i + BODY_CHUNK_BYTES] for i in range(0, len(body), BODY_CHUNK_BYTES)]
    chunks = chunks or [b""]
    return [
        pb.ProcessingResponse(request_body=_streamed(chunk, i == len(chunks) - 1))
        for i, chunk in enumerate(chunks)
    ]


def streamed_response_body(body: bytes, end_of_stream: bool) -> pb.ProcessingResponse:
    return pb.ProcessingResponse(response_body=_streamed(body, end_of_stream))


def immediate(
    status: int, message: str, kind: str, retry_after_s: int | None = None
) -> pb.ProcessingResponse:
    """The gateway answers the client itself: OpenAI's error JSON, as the HTTP router does."""
    headers = {"content-type": "application/json"}
    if retry_after_s is not None:
        headers["retry-after"] = str(retry_after_s)
    body = {"error": {"message": message, "type": kind, "param": None, "code": status}}
    return pb.ProcessingResponse(immediate_response=pb.ImmediateResponse(
        status=http_status_pb2.HttpStatus(code=status),
        headers=_set_headers(headers),
        body=json.dumps(body).encode(),
        details=f"llmservice router: {kind}",
    ))  # fmt: skip
