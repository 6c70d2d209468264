"""The metrics the Gateway API Inference Extension's endpoint picker requires of a model
server, read from the protocol document of the pinned module (gateway_crds.protocol_doc):
its metric table's vLLM column, and its LoRA section. Pure parsing, no I/O."""

from __future__ import annotations

import re
from dataclasses import dataclass

_TICKED = re.compile(r"`([^`]+)`")


@dataclass(frozen=True)
class MetricRow:
    """One row of the "Metrics Reporting" table, as vLLM names it."""

    concept: str  # the document's own name, e.g. TotalQueuedRequests
    type: str  # the Prometheus type, e.g. gauge ("Labeled/Gauge" -> gauge)
    optional: bool  # marked "[Optional]"
    metric: str  # the vLLM column's metric name
    label: str | None  # for a labeled metric, the label that carries the value


@dataclass(frozen=True)
class LoraMetric:
    """The "LoRA Adapter Serving" section: one gauge and its labels."""

    metric: str
    type: str
    labels: frozenset[str]


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def metric_table(doc: str) -> list[MetricRow]:
    """Every row of the table whose header has a "vLLM metric" column."""
    lines = doc.splitlines()
    (header_at,) = [i for i, line in enumerate(lines) if line.startswith("|") and "vLLM metric" in line]
    header = _cells(lines[header_at])
    concept_col, type_col, vllm_col = header.index("Metric"), header.index("Type"), header.index("vLLM metric")
    rows = []
    for line in lines[header_at + 2 :]:  # past the |---| separator
        if not line.startswith("|"):
            break
        cells = _cells(line)
        concept = cells[concept_col]
        optional = concept.startswith("[Optional]")
        names = _TICKED.findall(cells[vllm_col])
        label = names[1] if "label name" in cells[vllm_col] and len(names) > 1 else None
        rows.append(
            MetricRow(
                concept=concept.removeprefix("[Optional]").strip(),
                type=cells[type_col].split("/")[-1].strip().lower(),
                optional=optional,
                metric=names[0],
                label=label,
            )
        )
    return rows


def lora_metric(doc: str) -> LoraMetric:
    """The LoRA section's metric name (as implemented in vLLM), type and label names."""
    section = doc.split("### LoRA Adapter Serving", 1)[1].split("\n### ", 1)[0]
    (name,) = re.findall(r"Metric name implemented in vLLM:\s*`([^`]+)`", section)
    (type_,) = re.findall(r"Metric type:\s*(\w+)", section)
    labels_part = section.split("Metric labels:", 1)[1]
    labels = re.findall(r"^\s*\*\s*`([^`]+)`:", labels_part, flags=re.MULTILINE)
    return LoraMetric(metric=name, type=type_.lower(), labels=frozenset(labels))
