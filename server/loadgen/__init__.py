"""The load generator behind `llmservice bench serve`: it ships with the server."""
