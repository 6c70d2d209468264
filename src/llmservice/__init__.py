"""llmservice: a Kubernetes operator for LLM serving and the inference server it runs."""

__version__ = "0.1.0"
