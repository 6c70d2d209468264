"""The device slot pool: per layer and projection, stacks of lora_A [slots, R, in] and
lora_B [slots, out, R] zero-padded to --max-lora-rank, and the step's row -> slot map.

The model asks `add(layer, modules, x, out)` after each projection: the delta of each
row group is added into that module's columns of `out` (fused q/k/v and gate/up
outputs take one call), never merged into the base weights.
"""

from __future__ import annotations

import torch
from llmservice.server.lora.adapter import LoRAAdapter
from llmservice.server.lora.fit import projection_shapes
from llmservice.server.model.config import ModelConfig

MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class LoRAWeights:
    def __init__(self, config: ModelConfig, num_slots: int, max_rank: int, device: torch.device, dtype: torch.dtype):
        self.num_slots, self.max_rank = num_slots, max_rank
        self.shapes = projection_shapes(config)
        self.a: list[dict[str, torch.Tensor]] = []
        self.b: list[dict[str, torch.Tensor]] = []
        for _ in range(config.num_layers):
            self.a.append({m: torch.zeros(num_slots, max_rank, self.shapes[m][0], device=device, dtype=dtype)
                           for m in MODULES})  # fmt: skip
            self.b.append({m: torch.zeros(num_slots, self.shapes[m][1], max_rank, device=device, dtype=dtype)
                           for m in MODULES})  # fmt: skip
        self.scalings = [0.0] * num_slots  # host floats: no device read per projection
        # per slot: the modules its adapter targets in each layer (others are zeros: skipped)
        self.targets: list[set[tuple[int, str]]] = [set() for _ in range(num_slots)]
        self.groups: list[tuple[int, torch.Tensor]] | None = None  # this step's (slot, rows)
        self.device = device

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for layer in self.a + self.b for t in layer.values())

    def load_slot(self, slot: int, adapter: LoRAAdapter) -> None:
        """Copy an adapter into a slot (what it does not target stays zero)."""
        for layer, mods in enumerate(self.a):
            for m in MODULES:
                mods[m][slot].zero_()
                self.b[layer][m][slot].zero_()
        for (layer, m), (a, b) in adapter.weights.items():
            r = a.shape[0]
            self.a[layer][m][slot, :r].copy_(a)
            self.b[layer][m][slot, :, :r].copy_(b)
        self.scalings[slot] = adapter.scaling
        self.targets[slot] = set(adapter.weights)

    def set_rows(self, row_slots: list[int] | None) -> None:
        """The step's slot per flat row (-1: the base model); None or all -1: no delta."""
        self.groups = None
        if not row_slots or max(row_slots) < 0:
            return
        rows: dict[int, list[int]] = {}
        for i, s in enumerate(row_slots):
            if s >= 0:
                rows.setdefault(s, []).append(i)
        self.groups = [(s, torch.tensor(r, device=self.device)) for s, r in sorted(rows.items())]

    @property
    def active(self) -> bool:
        return self.groups is not None

    def add(self, layer: int, modules: tuple[str, ...], x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """out[:, module's columns] += scaling * x @ A^T @ B^T for each row group."""
        assert self.groups is not None
        for slot, rows in self.groups:
            xs = None
            col = 0
            for m in modules:
                width = self.shapes[m][1]
                if (layer, m) in self.targets[slot]:
                    xs = x.index_select(0, rows) if xs is None else xs
                    delta = (xs @ self.a[layer][m][slot].T) @ self.b[layer][m][slot].T
                    out[:, col : col + width].index_add_(0, rows, delta, alpha=self.scalings[slot])
                col += width
        return out


def lora_weights_for(config, model) -> LoRAWeights:
    """The slot pool of --max-loras x --max-lora-rank on the model's device and dtype."""
    return LoRAWeights(model.config, config.max_loras, config.max_lora_rank, model.device, model.dtype)
