"""CORS headers as llama-server 0c1e570 writes them (server-http.cpp's pre-routing handler): with
--cors-origins * and --cors-credentials (the defaults) the request's Origin is echoed back; with "localhost" only
an Origin whose host is localhost, 127.0.0.1 or ::1 is (any other gets no Allow-Origin header, and a warning);
any other value is sent as it is. OPTIONS answers add Allow-Credentials, -Methods and -Headers."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from urllib.parse import urlsplit

from ..params import ServerParams

log = logging.getLogger("llamacmp.server")
LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")


def origin_is_localhost(origin: str) -> bool:
    try:
        return urlsplit(origin).hostname in LOCAL_HOSTS
    except ValueError:
        return False


@dataclass(frozen=True)
class CorsPolicy:
    origins: str = "*"
    methods: str = "GET, POST, DELETE, OPTIONS"
    headers: str = "*"
    credentials: bool = True

    @classmethod
    def from_opts(cls, opts: ServerParams) -> "CorsPolicy":
        return cls(opts.cors_origins, opts.cors_methods, opts.cors_headers, opts.cors_credentials)

    def allow_origin(self, origin: str) -> str | None:
        """The Access-Control-Allow-Origin value for a request with this Origin ("" when it sent none), or None
        for no header."""
        if self.credentials and self.origins == "*":
            return origin
        if self.origins == "localhost":
            if origin and origin_is_localhost(origin):
                return origin
            if origin:
                log.warning("(CORS) skip non-localhost origin: %s", origin)
            return None
        return self.origins

    def preflight_headers(self) -> dict[str, str]:
        return {"Access-Control-Allow-Credentials": "true" if self.credentials else "false",
                "Access-Control-Allow-Methods": self.methods, "Access-Control-Allow-Headers": self.headers}
