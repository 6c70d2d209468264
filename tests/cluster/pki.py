"""Throw-away PKI for the test control plane, made with the `openssl` CLI.

A real kube-apiserver refuses to serve without TLS and cannot issue service-account
tokens without a signing key, so every session makes its own: a CA, a serving
certificate for 127.0.0.1, and an RSA key pair for service-account tokens. The
`openssl` command is used (present on Debian) rather than a Python crypto package so
the suite needs no extra dependency.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

# Names a client may use for the API server: the loopback address the tests dial and the
# in-cluster names pods use (the fake kubelet's pods reach the server on 127.0.0.1).
SERVING_SANS = (
    "IP:127.0.0.1",
    "IP:10.96.0.1",
    "DNS:localhost",
    "DNS:kubernetes",
    "DNS:kubernetes.default",
    "DNS:kubernetes.default.svc",
    "DNS:kubernetes.default.svc.cluster.local",
)


@dataclass(frozen=True)
class Pki:
    """Paths of the files the control-plane components are started with."""

    ca_cert: Path
    ca_key: Path
    serving_cert: Path
    serving_key: Path
    sa_key: Path
    sa_pub: Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_pki(directory: Path) -> Pki:
    """Create a CA, a serving cert signed by it, and a service-account key pair."""
    directory.mkdir(parents=True, exist_ok=True)
    d = directory
    _openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        "-keyout", "ca.key", "-out", "ca.crt", "-subj", "/CN=llmservice-test-ca",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
        cwd=d,
    )  # fmt: skip
    _openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-keyout", "apiserver.key",
        "-out", "apiserver.csr", "-subj", "/CN=kube-apiserver",
        cwd=d,
    )  # fmt: skip
    (d / "apiserver.ext").write_text(
        "basicConstraints=CA:FALSE\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth\n"
        f"subjectAltName={','.join(SERVING_SANS)}\n"
    )
    _openssl(
        "x509", "-req", "-in", "apiserver.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-days", "2", "-out", "apiserver.crt",
        "-extfile", "apiserver.ext",
        cwd=d,
    )  # fmt: skip
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=d)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=d)
    return Pki(
        ca_cert=d / "ca.crt",
        ca_key=d / "ca.key",
        serving_cert=d / "apiserver.crt",
        serving_key=d / "apiserver.key",
        sa_key=d / "sa.key",
        sa_pub=d / "sa.pub",
    )
