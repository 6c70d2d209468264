"""The device slot pool: per layer and projection, stacks of lora_A [slots, R, in] and
lora_B [slots, out, R] zero-padded to --max-lora-rank, and the step's row -> slot map.

The model asks `add(layer, modules, x, out)` after each projection: the delta of each
row group is added into that module's columns of `out` (fused q/k/v and gate/up
outputs take one call), never merged into the base weights.

Each fused group's stacks are stored side by side, `A [slots, n_modules * R, in]` and
`B [slots, sum(out), R]`, with each module's stack a view into them: on CUDA the Triton
kernels (kernels/triton_lora.py) take the whole group in one shrink and one expand
launch per projection for all the step's rows. On CPU, B's storage is transposed
([slots, R, W]; `group_b` is its [slots, W, R] view) and, in fp32, the C kernels
(kernels/cpu_lora.c, through server/lora/cpu.py) take the group in one call per projection,
in the Python layer loop and inside the one-call C decoder alike, skipping each slot's
rank padding and untargeted modules by `ranks`. Elsewhere the per-group torch loop reads
the module views.
"""

from __future__ import annotations

import torch
from llmservice.kernels import ops
from llmservice.kernels.cpu_lora import StepRows
from llmservice.kernels.lora_rows import LoRATiles, lora_tiles
from llmservice.server.lora.adapter import LoRAAdapter
from llmservice.server.lora.cpu import cpu_stacks
from llmservice.server.lora.fit import projection_shapes
from llmservice.server.model.config import ModelConfig

MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# the projections the model computes as one GEMM each (server/model/llama.py's order)
GROUPS = (("q_proj", "k_proj", "v_proj"), ("o_proj",), ("gate_proj", "up_proj"), ("down_proj",))


class LoRAWeights:
    def __init__(self, config: ModelConfig, num_slots: int, max_rank: int, device: torch.device, dtype: torch.dtype):
        self.num_slots, self.max_rank = num_slots, max_rank
        self.shapes = projection_shapes(config)
        # per layer: each group's stacks, and each module's views into them
        self.group_a: list[dict[tuple[str, ...], torch.Tensor]] = []
        self.group_b: list[dict[tuple[str, ...], torch.Tensor]] = []
        self.a: list[dict[str, torch.Tensor]] = []
        self.b: list[dict[str, torch.Tensor]] = []
        # per layer and group: int32 [slots, modules], each slot's rank (0: not targeted)
        self.ranks: list[dict[tuple[str, ...], torch.Tensor]] = []
        for _ in range(config.num_layers):
            self.group_a.append({})
            self.group_b.append({})
            self.ranks.append({g: torch.zeros(num_slots, len(g), dtype=torch.int32) for g in GROUPS})
            self.a.append({})
            self.b.append({})
            for group in GROUPS:
                fan_in = self.shapes[group[0]][0]
                widths = [self.shapes[m][1] for m in group]
                a = torch.zeros(num_slots, len(group) * max_rank, fan_in, device=device, dtype=dtype)
                if device.type == "cpu":  # stored [slots, R, W]: the C expand reads B's rank rows
                    b = torch.zeros(num_slots, max_rank, sum(widths), dtype=dtype).transpose(1, 2)
                else:
                    b = torch.zeros(num_slots, sum(widths), max_rank, device=device, dtype=dtype)
                self.group_a[-1][group], self.group_b[-1][group] = a, b
                col = 0
                for i, (m, width) in enumerate(zip(group, widths, strict=True)):
                    self.a[-1][m] = a[:, i * max_rank : (i + 1) * max_rank]
                    self.b[-1][m] = b[:, col : col + width]
                    col += width
        self.scalings = [0.0] * num_slots  # host floats: no device read per projection
        self.scaling_tensor = torch.zeros(num_slots, dtype=torch.float32, device=device)  # the kernels'
        # per slot: the modules its adapter targets in each layer (others are zeros: skipped)
        self.targets: list[set[tuple[int, str]]] = [set() for _ in range(num_slots)]
        self.row_slots: list[int] = []  # this step's slot per flat row; empty: no adapter rows
        self.groups: list[tuple[int, torch.Tensor]] | None = None  # its (slot, rows), torch path
        self.tiles: LoRATiles | None = None  # the Triton kernels' row tiles, built at first use
        self.device = device
        self.cpu = cpu_stacks(self)  # the C kernels' view (CPU, fp32), else None
        self.cpu_rows: StepRows | None = None  # this step's rows for them, built at first use

    @property
    def nbytes(self) -> int:
        stacks = self.group_a + self.group_b
        return sum(t.numel() * t.element_size() for layer in stacks for t in layer.values())

    def load_slot(self, slot: int, adapter: LoRAAdapter) -> None:
        """Copy an adapter into a slot (what it does not target stays zero)."""
        for layer, mods in enumerate(self.a):
            for m in MODULES:
                mods[m][slot].zero_()
                self.b[layer][m][slot].zero_()
        for ranks in self.ranks:
            for table in ranks.values():
                table[slot] = 0
        for (layer, m), (a, b) in adapter.weights.items():
            r = a.shape[0]
            self.a[layer][m][slot, :r].copy_(a)
            self.b[layer][m][slot, :, :r].copy_(b)
            group = next(g for g in GROUPS if m in g)
            self.ranks[layer][group][slot, group.index(m)] = r
        self.scalings[slot] = adapter.scaling
        self.scaling_tensor[slot] = adapter.scaling
        self.targets[slot] = set(adapter.weights)

    def set_rows(self, row_slots: list[int] | None) -> None:
        """The step's slot per flat row (-1: the base model); None or all -1: no delta.
        The row groups (torch path) or tiles (Triton path) are built at the step's first
        `add`, for the path that runs."""
        self.groups, self.tiles, self.cpu_rows = None, None, None
        self.row_slots = list(row_slots) if row_slots and max(row_slots) >= 0 else []

    @property
    def active(self) -> bool:
        return bool(self.row_slots)

    def _row_groups(self) -> list[tuple[int, torch.Tensor]]:
        if self.groups is None:
            rows: dict[int, list[int]] = {}
            for i, s in enumerate(self.row_slots):
                if s >= 0:
                    rows.setdefault(s, []).append(i)
            self.groups = [(s, torch.tensor(r, device=self.device)) for s, r in sorted(rows.items())]
        return self.groups

    def step_rows(self) -> StepRows | None:
        """This step's rows for the C kernels (the one-call decoder takes them too); None
        where they do not run (not CPU fp32, or no adapter rows)."""
        if self.cpu is None or not self.active:
            return None
        if self.cpu_rows is None:
            self.cpu_rows = self.cpu.rows(self.row_slots)
        return self.cpu_rows

    def add(self, layer: int, modules: tuple[str, ...], x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """out[:, module's columns] += scaling * x @ A^T @ B^T for each row group."""
        assert self.active
        if ops.backend_for(x) == "triton":
            self._add_triton(layer, modules, x, out)
            return out
        rows = self.step_rows()
        if rows is not None and self.cpu.add(layer, GROUPS.index(modules), rows, x, out):
            return out
        for slot, rows in self._row_groups():
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

    def _add_triton(self, layer: int, modules: tuple[str, ...], x: torch.Tensor, out: torch.Tensor) -> None:
        """All row groups and all the group's modules in one shrink and one expand launch."""
        if self.tiles is None:
            self.tiles = lora_tiles(self.row_slots, self.device)
        widths = tuple(self.shapes[m][1] for m in modules)
        b = self.group_b[layer][modules]
        b = b if b.stride(2) == 1 else b.contiguous()  # CPU (the interpreter): B is stored transposed
        ops.lora_add(x, self.group_a[layer][modules], b, self.scaling_tensor, self.tiles, widths, out)


def lora_weights_for(config, model) -> LoRAWeights:
    """The slot pool of --max-loras x --max-lora-rank on the model's device and dtype."""
    return LoRAWeights(model.config, config.max_loras, config.max_lora_rank, model.device, model.dtype)
