"""`spec.gateway` as typed data, with the CRD's defaults (render_gateway.py renders it). Pure."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

EPP_PORT = 9002  # the reference endpoint picker's ext-proc port


@dataclass(frozen=True)
class GatewaySpec:
    """`spec.gateway`, with the CRD's defaults."""

    inference_pool: bool = False
    picker_name: str | None = None  # None: "<name>-epp"
    picker_port: int = EPP_PORT
    failure_mode: str = "FailClose"
    priority: int | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> GatewaySpec:
        data = data or {}
        picker = data.get("endpointPicker") or {}
        return cls(
            inference_pool=bool(data.get("inferencePool", False)),
            picker_name=picker.get("name") or None,
            picker_port=int(picker.get("port") or EPP_PORT),
            failure_mode=str(picker.get("failureMode") or "FailClose"),
            priority=None if data.get("priority") is None else int(data["priority"]),
        )
