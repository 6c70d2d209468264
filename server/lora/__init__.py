"""LoRA adapters: PEFT-format loading and the per-row-group delta (docs/lora.md)."""
