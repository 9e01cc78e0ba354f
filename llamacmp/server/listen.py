"""Where llamacmp-server listens: host/port or UNIX socket, HTTPS (--ssl-key-file/--ssl-cert-file) and
--api-prefix, as keyword arguments for uvicorn and an app wrapper."""
from __future__ import annotations

import socket

from ..params import Params


def hosts(p: Params) -> list[str]:
    """--host as a list: llama-server 0c1e570 listens on each address of "a,b" (b8462 took one)."""
    return [h.strip() for h in p.server.host.split(",")]


def uvicorn_kwargs(p: Params) -> dict:
    """host/port (or uds for a host ending in .sock) and the TLS files; ValueError when only one of them is given
    or when a UNIX socket is listed with other addresses."""
    s = p.server
    if len(hosts(p)) > 1 and any(h.endswith(".sock") for h in hosts(p)):
        raise ValueError(f"--host {s.host}: a UNIX socket cannot be listed with other addresses")
    kw: dict = {"uds": s.host} if s.host.endswith(".sock") else {"host": hosts(p)[0], "port": s.port}
    if bool(s.ssl_key_file) != bool(s.ssl_cert_file):
        raise ValueError("--ssl-key-file and --ssl-cert-file must be given together")
    if s.ssl_key_file:
        kw.update(ssl_keyfile=s.ssl_key_file, ssl_certfile=s.ssl_cert_file)
    return kw


def listen_sockets(p: Params) -> list[socket.socket] | None:
    """One bound socket per address when --host lists several (uvicorn serves them all); None for one address,
    which uvicorn binds itself. OSError names the address that cannot be bound."""
    if len(hosts(p)) == 1:
        return None
    out = []
    for h in hosts(p):
        family = socket.AF_INET6 if ":" in h else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)   # "::" next to "0.0.0.0" must not clash
        try:
            sock.bind((h, p.server.port))
        except OSError as e:
            sock.close()
            for s in out:
                s.close()
            raise OSError(f"cannot listen on {h}:{p.server.port}: {e.strerror}") from None
        out.append(sock)
    return out


def listening_address(p: Params) -> str:
    s = p.server
    if s.host.endswith(".sock"):
        return s.host
    scheme = "https" if s.ssl_cert_file else "http"
    return ", ".join(f"{scheme}://{f'[{h}]' if ':' in h else h}:{s.port}{s.api_prefix}" for h in hosts(p))


def with_prefix(app, prefix: str):
    """The app served under `prefix` (llama-server's --api-prefix): /prefix/v1/models, and nothing outside it."""
    if not prefix:
        return app
    from starlette.applications import Starlette
    from starlette.routing import Mount
    return Starlette(routes=[Mount(prefix, app=app)])
