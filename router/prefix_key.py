"""The prefix key of a request: what requests that can share KV cache have in common. Pure.

The router has no tokenizer, so "the first N tokens' worth" is N x CHARS_PER_TOKEN
characters of text (about 4 for English with a BPE tokenizer), or the first N ids of a
prompt given as token ids. For chat, the text is the messages before the last user
turn (the system prompt and the history every later turn repeats); a conversation of
one user message uses that message. The model name is part of the key: two models on
one router never share a pod's cache.
"""

from __future__ import annotations

from typing import Any

CHARS_PER_TOKEN = 4
_FIELD, _MESSAGE = "\x1f", "\x1e"  # separators that never occur in ordinary text


def _content_text(content: Any) -> str:
    """A message's content: a string, or the text parts of a content-part list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text", "") for p in content if isinstance(p, dict)]
        return "".join(p for p in parts if isinstance(p, str))
    return ""


def chat_prefix(messages: list[Any]) -> str:
    """The messages up to the last user turn, as one string (role and content)."""
    dicts = [m for m in messages if isinstance(m, dict)]
    users = [i for i, m in enumerate(dicts) if m.get("role") == "user"]
    head = dicts[: users[-1]] if users and users[-1] > 0 else dicts[:1]
    return _MESSAGE.join(
        f"{m.get('role', '')}{_FIELD}{_content_text(m.get('content'))}" for m in head
    )


def prefix_key(body: Any, prefix_tokens: int) -> bytes | None:
    """The key to hash for an OpenAI request body, or None when it has no prompt."""
    if not isinstance(body, dict) or prefix_tokens <= 0:
        return None
    model = str(body.get("model", ""))
    chars = prefix_tokens * CHARS_PER_TOKEN
    messages = body.get("messages")
    if isinstance(messages, list) and messages:
        text = chat_prefix(messages)[:chars]
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
            prompt = prompt[0]  # a batch: its first prompt
        if isinstance(prompt, str):
            text = prompt[:chars]
        elif (
            isinstance(prompt, list)
            and prompt
            and all(isinstance(t, int) for t in prompt[:prefix_tokens])
        ):
            text = "ids:" + ",".join(str(t) for t in prompt[:prefix_tokens])
        else:
            return None
    if not text:
        return None
    return f"{model}{_MESSAGE}{text}".encode()
