"""One HTTP request's ext-proc conversation with the gateway: messages in, answers out. Pure.

The gateway (Envoy) opens one bidirectional stream per HTTP request and sends its phases
in order: request headers, request body (chunks), response headers, response body,
trailers. `ExtProcStream.feed` takes one message and returns what to send back, so the
protocol's rules are plain data a test can assert; the gRPC servicer (ext_proc.py) only
moves messages. When the pick happens depends on the request body mode Envoy announces
(its `protocol_config`, sent in the first message):

- full-duplex streamed (the inference extension's mode, and assumed when Envoy does not
  say): the headers' answer waits until the whole body arrived; then the headers answer
  names the pod and the body goes back unchanged as streamed body responses;
- buffered: the headers continue at once and the body's answer names the pod (Envoy
  holds the headers until then);
- none or streamed: the body never arrives before the headers leave, so the pod is
  picked from the headers alone (no prefix key: least-loaded).

A request without a body (headers with end_of_stream) is picked at its headers.
No eligible pod: an ImmediateResponse 503; a body that is not JSON: 400; a body past
`max_body_bytes`: 413. Response phases pass through untouched.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Protocol

from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from llmservice.router import ext_proc_messages as msg

MAX_BODY_BYTES = 64 * 1024 * 1024  # the HTTP router's own limit (proxy.py client_max_size)
RETRY_AFTER_S = 5


@dataclass(frozen=True)
class Picked:
    pod: str  # the pod's name (load accounting)
    address: str  # its `ip:port` (what the gateway dials)
    adapter: str | None = None  # the request's LoRA adapter (counted active on the pod)


class Picker(Protocol):
    def pick(self, body: Any, subset: frozenset[str] | None) -> Picked | None:
        """A pod for this request body (parsed JSON, or None), within `subset` if given."""
        ...


def unavailable(service: str, subset: frozenset[str] | None) -> pb.ProcessingResponse:
    where = "of the gateway's endpoint subset " if subset is not None else ""
    return msg.immediate(
        503,
        f"{service or 'the model'} has no Ready replica {where}to send the request to; retry later",
        "service_unavailable",
        RETRY_AFTER_S,
    )


class ExtProcStream:
    def __init__(self, picker: Picker, service: str = "", max_body_bytes: int = MAX_BODY_BYTES):
        self.picker = picker
        self.service = service
        self.max_body_bytes = max_body_bytes
        self.request_mode: int | None = None
        self.response_mode: int | None = None
        self.subset: frozenset[str] | None = None
        self.body = bytearray()
        self.picked: Picked | None = None
        self.closed = False  # an immediate response was sent: Envoy ends the stream
        self._first = True

    # --- phases ------------------------------------------------------------------------

    def feed(self, request: pb.ProcessingRequest) -> list[pb.ProcessingResponse]:
        if self._first:
            self._first = False
            self.request_mode = msg.request_body_mode(request)
            self.response_mode = msg.response_body_mode(request)
        hint = msg.subset_hint(request)
        if hint is not None:
            self.subset = hint
        phase = request.WhichOneof("request")
        if phase == "request_headers":
            return self._request_headers(request.request_headers)
        if phase == "request_body":
            return self._request_body(request.request_body)
        if phase == "response_headers":
            return [msg.continue_response_headers()]
        if phase == "response_body":
            body = request.response_body
            if self.response_mode in (None, msg.FULL_DUPLEX):
                return [msg.streamed_response_body(body.body, body.end_of_stream)]
            return [msg.continue_response_body()]
        if phase in ("request_trailers", "response_trailers"):
            return [msg.continue_trailers(request)]
        return []

    def _request_headers(self, headers: pb.HttpHeaders) -> list[pb.ProcessingResponse]:
        if headers.end_of_stream or self.request_mode in (msg.Mode.NONE, msg.Mode.STREAMED):
            return [self._choose(None, msg.request_headers_with_endpoint)]
        if self.request_mode in msg.BUFFERED_MODES:
            return [msg.continue_request_headers()]
        return []  # full duplex: answered once the body is complete

    def _request_body(self, body: pb.HttpBody) -> list[pb.ProcessingResponse]:
        if self.picked is not None or self.closed:
            return [msg.continue_request_body()]  # streamed mode: picked at the headers
        self.body += body.body
        if len(self.body) > self.max_body_bytes:
            return [self._close(msg.immediate(
                413, f"request body is larger than {self.max_body_bytes} bytes",
                "invalid_request_error",
            ))]  # fmt: skip
        partial = self.request_mode == msg.Mode.BUFFERED_PARTIAL
        if not body.end_of_stream and not partial:
            return []
        try:
            parsed = json.loads(bytes(self.body)) if self.body else None
        except (ValueError, UnicodeDecodeError) as exc:
            return [self._close(msg.immediate(
                400, f"request body is not JSON: {exc}", "invalid_request_error"
            ))]  # fmt: skip
        if self.request_mode in msg.BUFFERED_MODES:
            return [self._choose(parsed, msg.request_body_with_endpoint)]
        answer = self._choose(parsed, msg.request_headers_with_endpoint)
        if self.closed:
            return [answer]
        return [answer, *msg.streamed_request_body(bytes(self.body))]

    # --- decisions ---------------------------------------------------------------------

    def _choose(self, body: Any, answer) -> pb.ProcessingResponse:
        picked = self.picker.pick(body, self.subset)
        if picked is None:
            return self._close(unavailable(self.service, self.subset))
        self.picked = picked
        return answer(picked.address)

    def _close(self, response: pb.ProcessingResponse) -> pb.ProcessingResponse:
        self.closed = True
        return response
