"""TLS for connections between hosts (stdlib :mod:`ssl`).

TLS is a layer under the job handshake, never instead of it: a TCP
connection first completes TLS (when configured), then proves the job secret
(:mod:`._handshake`) before a frame is read.  TLS keeps the traffic private
and, with ``mutual=True``, refuses peers without a certificate of the job's
CA before they can send a byte of the handshake.
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass
from typing import cast

__all__ = ("TLSConfig",)

StrPath = str | os.PathLike[str]


@dataclass(frozen=True)
class TLSConfig:
    """Certificates for meshio's TCP connections (PEM files).

    Args:
        cert: this process's certificate chain.
        key: its private key.
        ca: the CA bundle peers' certificates must chain to.
        mutual: listening sides demand a client certificate too (default);
            without it, only the listening side proves itself with TLS (the
            job secret still authenticates both).
        check_hostname: a dialler checks that the certificate names the host
            or IP it dialled (default); turn off only for certificates that
            cannot name the hosts (the job secret still authenticates them).
    """

    cert: StrPath
    key: StrPath
    ca: StrPath
    mutual: bool = True
    check_hostname: bool = True

    def __post_init__(self) -> None:
        for name in ("cert", "key", "ca"):
            path: object = getattr(self, name)
            if not isinstance(path, (str, os.PathLike)):
                raise TypeError(f"TLSConfig: {name} must be a path, got "
                                f"{type(path).__name__}")
            if not os.path.isfile(cast(StrPath, path)):
                raise FileNotFoundError(f"TLSConfig: {name} file "
                                        f"{os.fspath(cast(StrPath, path))!r} does not exist")

    def server_context(self) -> ssl.SSLContext:
        """The context of a listening side."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(self.cert, self.key)
        ctx.load_verify_locations(self.ca)
        ctx.verify_mode = ssl.CERT_REQUIRED if self.mutual else ssl.CERT_NONE
        return ctx

    def client_context(self) -> ssl.SSLContext:
        """The context of a dialling side (it always verifies the server)."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(self.cert, self.key)
        ctx.load_verify_locations(self.ca)
        ctx.check_hostname = self.check_hostname
        return ctx
