"""The `llmservice` command: one entry point for every subcommand."""

from llmservice.server.cli import main

__all__ = ["main"]
