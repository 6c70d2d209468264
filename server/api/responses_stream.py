"""Chat-completion chunks -> Responses API events (pure: no I/O, no engine).

/v1/responses runs the chat path and reads its stream (responses.py); this turns each
chunk into the Responses events it implies. Output items follow one another: text opens
a `message` item, each tool call a `function_call` item, and an item is done when the
next one opens or the answer ends. Whitespace before any item is held back and dropped
if a call comes first (the newline a model writes around a call is no message). The
non-streamed answer is the last event's `response`, so both agree by construction.
"""

from __future__ import annotations

import copy
import json
import time
import uuid
from typing import Any


class ChatStreamError(Exception):
    """The chat stream ended with an error chunk (`{"error": {...}}`)."""

    def __init__(self, error: dict):
        super().__init__(error.get("message", "error"))
        self.error = error


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def response_usage(usage: dict) -> dict:
    return {
        "input_tokens": usage["prompt_tokens"],
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": usage["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage["total_tokens"],
    }


def _text_part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


# The chat finish_reason -> the response's status (anything else: completed).
_STATUS = {"length": "incomplete", "abort": "failed"}
_FINAL_EVENT = {"completed": "response.completed", "incomplete": "response.incomplete", "failed": "response.failed"}


class ResponseEvents:
    """One response's events. `head` holds the response object's fixed fields (the
    request's settings, echoed); `id` is taken from the first chunk, the chat
    request's id, so a response's log lines and engine requests share it."""

    def __init__(self, head: dict[str, Any]):
        self.head = head
        self.sequence = 0
        self.output: list[dict] = []
        self.open: dict | None = None
        self.calls: dict[int, dict] = {}  # chat tool-call index -> its output item
        self.held = ""
        self.finish_reason: str | None = None
        self.final: dict | None = None

    # ---- events ----------------------------------------------------------------------------
    def _event(self, kind: str, **fields: Any) -> dict:
        event = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return event

    def _response(self, status: str, **fields: Any) -> dict:
        return {**self.head, "status": status, "output": copy.deepcopy(self.output), **fields}

    def _where(self, item: dict) -> dict:
        return {"item_id": item["id"], "output_index": self.output.index(item)}

    def chunk(self, chunk: dict) -> list[dict]:
        """The events one chat chunk implies; raises ChatStreamError on an error chunk."""
        if "error" in chunk:
            raise ChatStreamError(chunk["error"])
        events: list[dict] = []
        if self.sequence == 0:
            self.head = {**self.head, "id": "resp_" + str(chunk["id"]).removeprefix("chatcmpl-")}
            events += [self._event(kind, response=self._response("in_progress"))
                       for kind in ("response.created", "response.in_progress")]
        for choice in chunk.get("choices", []):
            delta = choice.get("delta") or {}
            if delta.get("content"):
                events += self._text(delta["content"])
            for call in delta.get("tool_calls") or []:
                events += self._call(call)
            if choice.get("finish_reason"):
                events += self._finish(choice["finish_reason"])
        if chunk.get("usage"):
            events.append(self._complete(chunk["usage"]))
        return events

    def error(self, error: dict) -> dict:
        """The `error` event that ends a stream whose generation failed."""
        code = error.get("code")
        return self._event("error", code=None if code is None else str(code),
                           message=error.get("message", "error"), param=error.get("param"))

    # ---- items -----------------------------------------------------------------------------
    def _add(self, item: dict) -> list[dict]:
        events = self._close("completed")
        self.output.append(item)
        self.open = item
        events.append(self._event("response.output_item.added", output_index=len(self.output) - 1,
                                  item=copy.deepcopy(item)))
        if item["type"] == "message":
            events.append(self._event("response.content_part.added", **self._where(item), content_index=0,
                                      part=_text_part("")))
        return events

    def _close(self, status: str) -> list[dict]:
        item, self.open = self.open, None
        if item is None:
            return []
        item["status"] = status
        where = self._where(item)
        if item["type"] == "message":
            text = item["content"][0]["text"]
            events = [
                self._event("response.output_text.done", **where, content_index=0, text=text, logprobs=[]),
                self._event("response.content_part.done", **where, content_index=0, part=_text_part(text)),
            ]
        else:
            events = [self._event("response.function_call_arguments.done", **where, arguments=item["arguments"])]
        events.append(self._event("response.output_item.done", output_index=where["output_index"],
                                  item=copy.deepcopy(item)))
        return events

    def _text(self, text: str) -> list[dict]:
        if self.open is not None and self.open["type"] == "message":
            return self._append(text)
        if not (self.held + text).strip():
            self.held += text
            return []
        text, self.held = self.held + text, ""
        return self._add_message() + self._append(text)

    def _add_message(self) -> list[dict]:
        return self._add({"id": _new_id("msg"), "type": "message", "role": "assistant",
                          "status": "in_progress", "content": [_text_part("")]})

    def _append(self, text: str) -> list[dict]:
        item = self.open
        item["content"][0]["text"] += text
        return [self._event("response.output_text.delta", **self._where(item), content_index=0,
                            delta=text, logprobs=[])]

    def _call(self, call: dict) -> list[dict]:
        function = call.get("function") or {}
        events: list[dict] = []
        item = self.calls.get(call["index"])
        if item is None:
            self.held = ""
            item = {"id": _new_id("fc"), "type": "function_call", "status": "in_progress",
                    "call_id": call["id"], "name": function["name"], "arguments": ""}
            self.calls[call["index"]] = item
            events = self._add(item)
        arguments = function.get("arguments") or ""
        if arguments:
            item["arguments"] += arguments
            events.append(self._event("response.function_call_arguments.delta", **self._where(item),
                                      delta=arguments))
        return events

    def _finish(self, reason: str) -> list[dict]:
        self.finish_reason = reason
        events: list[dict] = []
        if not self.output:  # an answer without any item is still one message, maybe empty
            text, self.held = self.held, ""
            events = self._add_message() + (self._append(text) if text else [])
        return events + self._close("completed" if reason in ("stop", "tool_calls") else "incomplete")

    def _complete(self, usage: dict) -> dict:
        status = _STATUS.get(self.finish_reason or "stop", "completed")
        fields: dict[str, Any] = {"usage": response_usage(usage)}
        if status == "completed":
            fields["completed_at"] = int(time.time())
        if status == "incomplete":
            fields["incomplete_details"] = {"reason": "max_output_tokens"}
        if status == "failed":
            fields["error"] = {"code": "server_error", "message": "the engine aborted the generation"}
        self.final = self._response(status, **fields)
        return self._event(_FINAL_EVENT[status], response=self.final)


def sse_event(event: dict) -> str:
    """One Responses event as SSE: named by its type, as OpenAI sends them."""
    return f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False, separators=(',', ':'))}\n\n"
