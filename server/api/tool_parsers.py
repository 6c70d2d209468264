"""Generated text -> OpenAI message deltas (`content` and `tool_calls`), incrementally.

One parser per choice: `feed(text)` takes each new piece of text and returns the deltas
it can already send; `finish()` returns the rest. A non-streamed answer is the same
parser fed the whole text, then `merge`d, so streamed deltas concatenate to exactly
the non-streamed message.

Parsers (`--tool-call-parser`, as vLLM's names):
* `hermes`: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks, with any
  text around them as content (Hermes, Qwen 2.5, many fine-tunes);
* `json`: the whole answer is a call object (or an array of them), plain JSON
  (Llama 3.x's JSON tool format);
* default: `json` when the answer starts with `{` or `[`, else `hermes`.
For constrained modes: `named` streams the arguments as they are generated; `required`
sends each call of the array as soon as its object closes.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from llmservice.server.api.tools import arguments_text

TOOL_CALL_PARSERS = ("hermes", "json")
OPEN_TAG, CLOSE_TAG = "<tool_call>", "</tool_call>"


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def _call_delta(index: int, name: str, arguments: str) -> dict:
    call = {
        "index": index,
        "id": call_id(),
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }
    return {"tool_calls": [call]}


def as_call(obj: Any, names: tuple[str, ...]) -> tuple[str, str] | None:
    """(name, arguments text) of a parsed call object, if it is one of the tools."""
    if not isinstance(obj, dict) or obj.get("name") not in names:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if not isinstance(args, (dict, str)):
        return None
    return obj["name"], arguments_text(args)


class ToolParser:
    """Base: plain content, nothing parsed (tool_choice none, or no tools)."""

    def __init__(self, names: tuple[str, ...] = ()):
        self.names = names
        self.num_calls = 0

    def _call(self, name: str, arguments: str) -> dict:
        delta = _call_delta(self.num_calls, name, arguments)
        self.num_calls += 1
        return delta

    def feed(self, text: str) -> list[dict]:
        return [{"content": text}] if text else []

    def finish(self) -> list[dict]:
        return []


class NamedParser(ToolParser):
    """The output is the named function's arguments: stream them as they come."""

    def __init__(self, name: str):
        super().__init__((name,))
        self.name = name

    def feed(self, text: str) -> list[dict]:
        out = [] if self.num_calls else [self._call(self.name, "")]
        if text:
            out.append({"tool_calls": [{"index": 0, "function": {"arguments": text}}]})
        return out

    def finish(self) -> list[dict]:
        return [] if self.num_calls else [self._call(self.name, "")]


class RequiredParser(ToolParser):
    """The output is `[{"name", "parameters"}, ...]`: each call goes out when its object closes."""

    def __init__(self, names: tuple[str, ...]):
        super().__init__(names)
        self.depth = 0
        self.in_string = False
        self.escaped = False
        self.element: list[str] = []
        self.raw: list[str] = []

    def feed(self, text: str) -> list[dict]:
        self.raw.append(text)
        out = []
        for ch in text:
            if self.depth >= 2 or (self.depth == 1 and ch == "{"):
                self.element.append(ch)
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif ch == "\\":
                    self.escaped = True
                elif ch == '"':
                    self.in_string = False
                continue
            if ch == '"':
                self.in_string = True
            elif ch in "[{":
                self.depth += 1
            elif ch in "]}":
                self.depth -= 1
                if self.depth == 1 and ch == "}":
                    out.extend(self._element("".join(self.element)))
                    self.element = []
        return out

    def _element(self, text: str) -> list[dict]:
        try:
            call = as_call(json.loads(text), self.names)
        except ValueError:
            call = None
        return [self._call(*call)] if call else []

    def finish(self) -> list[dict]:
        if self.num_calls == 0:  # not a complete call (e.g. cut by max_tokens): keep the text
            text = "".join(self.raw)
            return [{"content": text}] if text else []
        return []


class HermesParser(ToolParser):
    """`<tool_call>...</tool_call>` blocks; text that may still open a tag is held back."""

    def __init__(self, names: tuple[str, ...]):
        super().__init__(names)
        self.buffer = ""
        self.inside = False

    def feed(self, text: str) -> list[dict]:
        self.buffer += text
        out: list[dict] = []
        while True:
            if self.inside:
                end = self.buffer.find(CLOSE_TAG)
                if end < 0:
                    return out
                body = self.buffer[:end]
                self.buffer = self.buffer[end + len(CLOSE_TAG) :]
                self.inside = False
                out.extend(self._block(body))
                continue
            start = self.buffer.find(OPEN_TAG)
            if start >= 0:
                if start:
                    out.append({"content": self.buffer[:start]})
                self.buffer = self.buffer[start + len(OPEN_TAG) :]
                self.inside = True
                continue
            keep = _partial_suffix(self.buffer, OPEN_TAG)
            if len(self.buffer) > keep:
                out.append({"content": self.buffer[: len(self.buffer) - keep]})
                self.buffer = self.buffer[len(self.buffer) - keep :]
            return out

    def _block(self, body: str) -> list[dict]:
        try:
            call = as_call(json.loads(body), self.names)
        except ValueError:
            call = None
        if call is None:  # not a call of ours: the text stays content
            return [{"content": OPEN_TAG + body + CLOSE_TAG}]
        return [self._call(*call)]

    def finish(self) -> list[dict]:
        rest = (OPEN_TAG if self.inside else "") + self.buffer
        self.buffer, self.inside = "", False
        return [{"content": rest}] if rest else []


class JSONParser(ToolParser):
    """The whole answer is a call or an array of calls; anything else is content."""

    def __init__(self, names: tuple[str, ...]):
        super().__init__(names)
        self.text = ""

    def feed(self, text: str) -> list[dict]:
        self.text += text
        return []

    def finish(self) -> list[dict]:
        calls = self._calls()
        if calls is None:
            return [{"content": self.text}] if self.text else []
        return [self._call(name, args) for name, args in calls]

    def _calls(self) -> list[tuple[str, str]] | None:
        try:
            obj = json.loads(self.text)
        except ValueError:
            return None
        items = obj if isinstance(obj, list) else [obj]
        calls = [as_call(item, self.names) for item in items]
        if not calls or any(c is None for c in calls):
            return None
        return calls  # type: ignore[return-value]


class AutoParser(ToolParser):
    """No --tool-call-parser: JSON if the answer opens with `{` or `[`, else Hermes tags."""

    def __init__(self, names: tuple[str, ...]):
        super().__init__(names)
        self.inner: ToolParser | None = None
        self.pending = ""

    def feed(self, text: str) -> list[dict]:
        if self.inner is None:
            self.pending += text
            head = self.pending.lstrip()
            if not head:
                return []
            self.inner = JSONParser(self.names) if head[0] in "{[" else HermesParser(self.names)
            text, self.pending = self.pending, ""
        return self.inner.feed(text)

    def finish(self) -> list[dict]:
        if self.inner is None:
            return [{"content": self.pending}] if self.pending else []
        return self.inner.finish()

    @property
    def called(self) -> int:
        return self.inner.num_calls if self.inner else 0


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of tag."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


def make_parser(
    mode: str, names: tuple[str, ...], named: str | None, parser: str | None
) -> ToolParser:
    if mode == "named" and named is not None:
        return NamedParser(named)
    if mode == "required":
        return RequiredParser(names)
    if mode == "auto":
        if parser == "hermes":
            return HermesParser(names)
        if parser == "json":
            return JSONParser(names)
        return AutoParser(names)
    return ToolParser(names)


def num_calls(parser: ToolParser) -> int:
    return parser.called if isinstance(parser, AutoParser) else parser.num_calls


def merge(deltas: list[dict]) -> tuple[str, list[dict]]:
    """Deltas -> (content, tool_calls) of one whole message."""
    content: list[str] = []
    calls: dict[int, dict] = {}
    for d in deltas:
        if "content" in d:
            content.append(d["content"])
        for c in d.get("tool_calls", []):
            if c["index"] not in calls:
                calls[c["index"]] = {
                    "id": c["id"],
                    "type": "function",
                    "function": dict(c["function"]),
                }
            else:
                calls[c["index"]]["function"]["arguments"] += c["function"].get("arguments", "")
    return "".join(content), [calls[i] for i in sorted(calls)]
