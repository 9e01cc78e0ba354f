"""Where llamacmp-server listens: host/port or UNIX socket, HTTPS (--ssl-key-file/--ssl-cert-file) and
--api-prefix, as keyword arguments for uvicorn and an app wrapper."""
from __future__ import annotations

from ..params import Params


def uvicorn_kwargs(p: Params) -> dict:
    """host/port (or uds for a host ending in .sock) and the TLS files; ValueError when only one of them is given
    or when --host lists several addresses."""
    s = p.server
    if "," in s.host:       # llama-server 0c1e570 listens on each; b8462 and llamacmp on one
        raise ValueError(f"--host {s.host}: listening on several addresses is not supported by llamacmp yet; "
                         "give one address")
    kw: dict = {"uds": s.host} if s.host.endswith(".sock") else {"host": s.host, "port": s.port}
    if bool(s.ssl_key_file) != bool(s.ssl_cert_file):
        raise ValueError("--ssl-key-file and --ssl-cert-file must be given together")
    if s.ssl_key_file:
        kw.update(ssl_keyfile=s.ssl_key_file, ssl_certfile=s.ssl_cert_file)
    return kw


def listening_address(p: Params) -> str:
    s = p.server
    if s.host.endswith(".sock"):
        return s.host
    scheme = "https" if s.ssl_cert_file else "http"
    return f"{scheme}://{s.host}:{s.port}{s.api_prefix}"


def with_prefix(app, prefix: str):
    """The app served under `prefix` (llama-server's --api-prefix): /prefix/v1/models, and nothing outside it."""
    if not prefix:
        return app
    from starlette.applications import Starlette
    from starlette.routing import Mount
    return Starlette(routes=[Mount(prefix, app=app)])
