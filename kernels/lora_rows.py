"""A step's LoRA rows grouped for the Triton LoRA kernels (triton_lora.py): tiles of up to
`block_m` rows that share one adapter slot, as row indices into the flat batch.

Built on the host from the per-row slot list the runner already has (no device sync),
once per step, and shared by every projection of every layer. Grouping by slot is what
lets one program multiply a tile of rows by one adapter's matrices (a segmented gather,
SGMV-style); gathering by index means the rows need not be sorted or contiguous, so
prefill chunks and decode rows (one per sequence) take the same path. Rows with slot -1
(the base model) are in no tile: the kernels never touch them. No Triton import here, so
server code can build tiles before anything decides interpreter or compiler.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

# tile heights: tl.dot needs at least 16 rows; taller tiles when an adapter has many rows
# (prefill) so its A/B are read by fewer programs
SMALL_TILE, LARGE_TILE = 16, 32


@dataclass(frozen=True)
class LoRATiles:
    row_ids: torch.Tensor  # int32 [adapter rows]: flat row indices, grouped by slot
    tile_slot: torch.Tensor  # int32 [tiles]: the slot of each tile's rows
    tile_start: torch.Tensor  # int32 [tiles]: offset of the tile's first row in row_ids
    tile_rows: torch.Tensor  # int32 [tiles]: rows in the tile (1..block_m)
    num_tiles: int
    block_m: int


def lora_tiles(
    row_slots: Sequence[int] | torch.Tensor, device: torch.device | str, block_m: int | None = None
) -> LoRATiles | None:
    """Tiles of the rows with a slot >= 0; None when no row uses an adapter. A tensor
    argument is read to the host (a sync): the server passes its host list."""
    slots = row_slots.tolist() if isinstance(row_slots, torch.Tensor) else list(row_slots)
    groups: dict[int, list[int]] = {}
    for row, slot in enumerate(slots):
        if slot >= 0:
            groups.setdefault(int(slot), []).append(row)
    if not groups:
        return None
    if block_m is None:
        block_m = SMALL_TILE if max(len(r) for r in groups.values()) <= SMALL_TILE else LARGE_TILE
    row_ids: list[int] = []
    tile_slot: list[int] = []
    tile_start: list[int] = []
    tile_rows: list[int] = []
    for slot, rows in sorted(groups.items()):
        for first in range(0, len(rows), block_m):
            tile_slot.append(slot)
            tile_start.append(len(row_ids) + first)
            tile_rows.append(min(block_m, len(rows) - first))
        row_ids.extend(rows)
    n, t = len(row_ids), len(tile_slot)
    # one host -> device copy for the whole step
    packed = torch.tensor(row_ids + tile_slot + tile_start + tile_rows, dtype=torch.int32).to(
        device
    )
    return LoRATiles(
        row_ids=packed[:n],
        tile_slot=packed[n : n + t],
        tile_start=packed[n + t : n + 2 * t],
        tile_rows=packed[n + 2 * t :],
        num_tiles=t,
        block_m=block_m,
    )
