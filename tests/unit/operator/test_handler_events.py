"""A handler's Event emitter works from another loop's thread: the status publisher runs
a pending request of a kopf handler from the autoscaler's or advisor's thread, where
kopf's event-queue context variables do not exist (LookupError before the fix)."""

from __future__ import annotations

import asyncio
import contextvars
import threading

import kopf
from kopf._core.engines import posting
from llmservice.operator.handlers import _emitter


def test_emit_from_a_thread_outside_the_handler_context_reaches_kopfs_queue():
    async def main() -> list[posting.K8sEvent]:
        queue: asyncio.Queue[posting.K8sEvent] = asyncio.Queue()
        posting.event_queue_loop_var.set(asyncio.get_running_loop())
        posting.event_queue_var.set(queue)
        posting.settings_var.set(kopf.OperatorSettings())
        meta = {"name": "a", "namespace": "n", "uid": "u"}
        body = kopf.Body({"apiVersion": "v1", "kind": "X", "metadata": meta})
        emit = _emitter(body)  # made inside the handler's context, as kopf runs handlers
        errors: list[BaseException] = []

        def elsewhere() -> None:  # a fresh thread: none of kopf's context variables
            try:
                emit("Normal", "Ready", "now ready")
            except BaseException as exc:  # noqa: BLE001 - the assertion below reports it
                errors.append(exc)

        thread = threading.Thread(target=contextvars.Context().run, args=(elsewhere,))
        thread.start()
        thread.join()
        assert errors == []
        return [await asyncio.wait_for(queue.get(), 5)]

    (event,) = asyncio.run(main())
    assert (event.type, event.reason, event.message) == ("Normal", "Ready", "now ready")
