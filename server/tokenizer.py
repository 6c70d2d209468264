"""Tokenizer (HF `tokenizers`, Rust) built from GGUF BPE material or tokenizer.json, plus chat templates.

The Rust tokenizer releases the GIL, so encode/decode can run in worker threads and
never block the server's event loop (the fifth batching mistake of docs/troubleshooting.md).
"""

from __future__ import annotations

from datetime import datetime

import jinja2
import jinja2.sandbox
from llmservice.server.model.loaded import TokenizerSource, UnsupportedModelError
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
from tokenizers.decoders import DecodeStream

# GGUF token types (llama.cpp): 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte
_CONTROL, _USER_DEFINED = 3, 4


def _pre_tokenizer(pre: str) -> pre_tokenizers.PreTokenizer:
    # ByteLevel with use_regex applies GPT-2's split rule, as llama.cpp does for "gpt2" vocabs.
    steps: list = [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
    if pre in ("smollm", "starcoder", "refact"):
        # These split every digit on its own before the GPT-2 rule (llama.cpp's regex list).
        steps.insert(0, pre_tokenizers.Digits(individual_digits=True))
    return pre_tokenizers.Sequence(steps)


def build_tokenizer(source: TokenizerSource) -> Tokenizer:
    if source.tokenizer_json is not None:
        return Tokenizer.from_file(str(source.tokenizer_json))
    if not source.tokens or not source.merges:
        raise UnsupportedModelError("model has no tokenizer (no tokenizer.json, no GGUF BPE vocab/merges)")
    vocab = {tok: i for i, tok in enumerate(source.tokens)}
    merges = [tuple(m.split(" ", 1)) for m in source.merges]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = _pre_tokenizer(source.pre)
    tok.decoder = decoders.ByteLevel()
    special = [
        AddedToken(t, special=True, normalized=False)
        for t, kind in zip(source.tokens, source.token_types, strict=False)
        if kind in (_CONTROL, _USER_DEFINED)
    ]
    tok.add_special_tokens(special)
    return tok


class TextTokenizer:
    """Encode/decode and chat-template rendering for one model."""

    def __init__(self, source: TokenizerSource, eos_token_ids: list[int] | None = None):
        self.tokenizer = build_tokenizer(source)
        self.bos_token_id = source.bos_token_id
        self.eos_token_ids = list(eos_token_ids or ([source.eos_token_id] if source.eos_token_id is not None else []))
        self.add_bos = source.add_bos_token
        self.chat_template = source.chat_template
        self._template = None
        if self.chat_template:
            env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            env.globals["raise_exception"] = _raise_template_error
            env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
            self._template = env.from_string(self.chat_template)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    def token_text(self, token_id: int) -> str:
        return self.tokenizer.id_to_token(token_id) or ""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = self.tokenizer.encode(text, add_special_tokens=False).ids
        if add_special_tokens and self.add_bos and self.bos_token_id is not None:
            if not ids or ids[0] != self.bos_token_id:
                ids = [self.bos_token_id, *ids]
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def decode_stream(self, skip_special_tokens: bool = True) -> DecodeStream:
        """Incremental detokenizer: O(new tokens) per step (vLLM #1099 was O(n^2))."""
        return DecodeStream(skip_special_tokens=skip_special_tokens)

    def apply_chat_template(
        self, messages: list[dict], add_generation_prompt: bool = True, tools: list[dict] | None = None
    ) -> str:
        if self._template is None:
            raise ValueError("this model has no chat template; use /v1/completions with a plain prompt")
        special = lambda i: self.tokenizer.id_to_token(i) if i is not None else ""  # noqa: E731
        return self._template.render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            tools=tools,  # HF convention: [{"type": "function", "function": {...}}] or None
            bos_token=special(self.bos_token_id),
            eos_token=special(self.eos_token_ids[0] if self.eos_token_ids else None),
        )


def _raise_template_error(message: str):
    raise ValueError(f"chat template error: {message}")
