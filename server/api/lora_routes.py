"""Runtime LoRA adapter loading with vLLM's endpoints and bodies: POST
/v1/load_lora_adapter {"lora_name", "lora_path"} and /v1/unload_lora_adapter
{"lora_name"}. Off unless VLLM_ALLOW_RUNTIME_LORA_UPDATING=true (vLLM's variable) and
--enable-lora; behind --api-key like every /v1 route. A refused adapter is a 400 and an
unknown one a 404; either way the adapters already loaded stay as they were."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse
from llmservice.server.api.errors import APIError
from llmservice.server.api.protocol import APIModel, ErrorResponse
from llmservice.server.engine.messages import LoadLoRA, UnloadLoRA
from llmservice.server.lora.sources import AdapterSourceError, resolve_adapter_path

RUNTIME_UPDATES_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"
controls = APIRouter(tags=["LoRA adapters"])


def runtime_updates_allowed(environ: Mapping[str, str] | None = None) -> bool:
    value = (os.environ if environ is None else environ).get(RUNTIME_UPDATES_ENV, "")
    return value.strip().lower() in ("1", "true")


class LoadLoRARequest(APIModel):
    lora_name: str
    lora_path: str


class UnloadLoRARequest(APIModel):
    lora_name: str
    lora_int_id: int | None = None  # accepted as vLLM does; the name decides


_JSON = "application/json"
_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorResponse, "description": "a refused adapter (rank, target modules, shapes, files), "
          "a name already loaded, or runtime updates off", "content": {_JSON: {}}},
    401: {"model": ErrorResponse, "description": "missing or wrong API key (--api-key)", "content": {_JSON: {}}},
    404: {"model": ErrorResponse, "description": "no adapter of that name is loaded", "content": {_JSON: {}}},
}


def _engine(raw: Request) -> Any:
    engine = raw.app.state.server.engine
    if not engine.config.enable_lora:
        raise APIError(400, "LoRA serving is off: start the server with --enable-lora")
    if not raw.app.state.allow_runtime_lora_updating:
        raise APIError(400, f"runtime LoRA updates are off: set {RUNTIME_UPDATES_ENV}=true")
    return engine


@controls.post("/v1/load_lora_adapter", response_class=PlainTextResponse, responses=_ERRORS)
async def load_lora_adapter(body: LoadLoRARequest, raw: Request):
    """Read, check and serve an adapter under `lora_name` (a request's `model`); an
    hf://ORG/NAME[@REVISION] path is downloaded first, on a worker thread."""
    engine, state = _engine(raw), raw.app.state.server
    path = body.lora_path
    if body.lora_name not in engine.lora_adapters:  # a name already loaded: the engine's 400, no download
        try:
            path = await asyncio.to_thread(resolve_adapter_path, body.lora_name, body.lora_path, state.download_dir)
        except AdapterSourceError as err:
            raise APIError(400, str(err), "lora_path") from None
        if path != body.lora_path:
            state.lora_sources[path] = body.lora_path
    answer = await engine.change_lora(LoadLoRA(body.lora_name, path))
    if answer.error is not None:
        raise APIError(answer.status, answer.error, "lora_path" if answer.status == 400 else "lora_name")
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")


@controls.post("/v1/unload_lora_adapter", response_class=PlainTextResponse, responses=_ERRORS)
async def unload_lora_adapter(body: UnloadLoRARequest, raw: Request):
    """Stop serving an adapter; requests already running with it finish."""
    answer = await _engine(raw).change_lora(UnloadLoRA(body.lora_name))
    if answer.error is not None:
        raise APIError(answer.status, answer.error, "lora_name")
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")
