"""The advisor: the seeds' batching mistakes found in live metrics, with the fix (docs/advisor.md)."""
