"""The prefix key: what requests that can share a pod's KV cache have in common."""

from __future__ import annotations

from llmservice.router.prefix_key import CHARS_PER_TOKEN, prefix_key

SYSTEM = {"role": "system", "content": "You are a helpful assistant. " * 20}


def chat(*messages, model="m"):
    return {"model": model, "messages": list(messages)}


def test_chat_key_is_the_messages_before_the_last_user_turn():
    a = prefix_key(chat(SYSTEM, {"role": "user", "content": "hi"}), 256)
    b = prefix_key(chat(SYSTEM, {"role": "user", "content": "something else"}), 256)
    assert a == b and a is not None
    other = prefix_key(
        chat({"role": "system", "content": "Be terse."}, {"role": "user", "content": "hi"}), 256
    )
    assert other != a


def test_history_is_part_of_the_key():
    turn1 = chat(SYSTEM, {"role": "user", "content": "q1"})
    turn2 = chat(SYSTEM, {"role": "user", "content": "q1"}, {"role": "assistant", "content": "a1"},
                 {"role": "user", "content": "q2"})  # fmt: skip
    long = prefix_key(turn2, 100_000)
    assert long != prefix_key(turn1, 100_000)


def test_the_key_is_cut_to_n_tokens_worth():
    a = {"model": "m", "prompt": "x" * 100 + "A"}
    b = {"model": "m", "prompt": "x" * 100 + "B"}
    assert prefix_key(a, 100 // CHARS_PER_TOKEN) == prefix_key(b, 100 // CHARS_PER_TOKEN)
    assert prefix_key(a, 200) != prefix_key(b, 200)


def test_one_user_message_keys_on_itself_and_content_parts_count():
    parts = chat({"role": "user", "content": [{"type": "text", "text": "hello"}]})
    plain = chat({"role": "user", "content": "hello"})
    assert prefix_key(parts, 64) == prefix_key(plain, 64) is not None


def test_model_and_token_ids_and_batches():
    assert prefix_key(chat(SYSTEM, model="a"), 64) != prefix_key(chat(SYSTEM, model="b"), 64)
    ids = {"model": "m", "prompt": [1, 2, 3, 4, 5]}
    assert prefix_key(ids, 3) == prefix_key({"model": "m", "prompt": [1, 2, 3, 9]}, 3)
    assert prefix_key({"model": "m", "prompt": ["abc", "zzz"]}, 64) == prefix_key(
        {"model": "m", "prompt": "abc"}, 64
    )


def test_no_prompt_no_key():
    assert prefix_key({"model": "m"}, 64) is None
    assert prefix_key([1, 2], 64) is None
    assert prefix_key({"model": "m", "prompt": ""}, 64) is None
    assert prefix_key({"model": "m", "prompt": "x"}, 0) is None
