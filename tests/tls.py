"""Certificates for tests of TLS: a CA of the test's own (``trustme``) and a server certificate it signed."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import trustme


@dataclass(frozen=True)
class TlsFiles:
    """A server's certificate chain and key (PEM), and the CA file that clients trust to verify it."""

    ca: Path
    cert: Path
    key: Path


def issue(directory: Path, *hosts: str, name: str = "server") -> TlsFiles:
    """A new CA, and a certificate for ``hosts`` that it signed, written under ``directory`` as
    ``<name>-ca.pem``, ``<name>.pem`` and ``<name>.key``."""
    ca = trustme.CA()
    issued = ca.issue_cert(*hosts)
    files = TlsFiles(directory / f"{name}-ca.pem", directory / f"{name}.pem", directory / f"{name}.key")
    ca.cert_pem.write_to_path(str(files.ca))
    for i, pem in enumerate(issued.cert_chain_pems):
        pem.write_to_path(str(files.cert), append=i > 0)
    issued.private_key_pem.write_to_path(str(files.key))
    return files
