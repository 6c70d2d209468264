"""`llmservice router`: the proxy in front of an LLMService's pods (docs/router.md).

Prefix-aware consistent hashing with bounded load (routing.py, prefix_key.py), requests
held while the service is at zero replicas (hold.py, wake.py), pods found from the
EndpointSlices of the pods' headless Service (endpoints.py). No torch import anywhere:
the router is a small process.
"""
