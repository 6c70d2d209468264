"""Where to reach a pod: its IP as the API publishes it, optionally rewritten.

Hosts-as-pods test clusters (tests/cluster's fake kubelet) publish routable pod IPs
(EndpointSlices refuse loopback addresses) whose processes really listen on loopback.
`LLMSERVICE_POD_ADDRESS_MAP="10.=127."` rewrites one address prefix to another, for
every component that dials pods: the router (EndpointSlices) and the operator's
scraper (pod status). Unset, addresses are used as published.
"""

from __future__ import annotations

import os

ADDRESS_MAP_ENV = "LLMSERVICE_POD_ADDRESS_MAP"
Rewrite = tuple[str, str]


def address_map(value: str | None = None) -> Rewrite | None:
    """("old prefix", "new prefix") from `value`, else from the environment; None if unset."""
    value = os.environ.get(ADDRESS_MAP_ENV, "") if value is None else value
    if "=" not in value:
        return None
    old, _, new = value.partition("=")
    return old, new


def rewrite_ip(ip: str, rewrite: Rewrite | None) -> str:
    if rewrite and ip.startswith(rewrite[0]):
        return rewrite[1] + ip[len(rewrite[0]) :]
    return ip


def host_of(ip: str, rewrite: Rewrite | None = None) -> str:
    """The URL host part for `ip` (IPv6 bracketed), after the rewrite."""
    ip = rewrite_ip(ip, rewrite)
    return f"[{ip}]" if ":" in ip else ip
