"""The chat page at / (webui.html, our own), or a folder of static files (--path), as llama-server 0c1e570:
--no-ui turns both off; --path replaces the page with the folder's files (a missing folder stops start-up)."""
from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from fastapi import FastAPI
from starlette.responses import FileResponse, Response
from starlette.staticfiles import StaticFiles

from ..params import ServerParams

# Pages a browser must load before it can ask for an API key: served without one (llama-server's public assets).
PAGE_PATHS = ("/", "/index.html", "/sw.js")

# A browser that once used llama-server's own UI at this address keeps its service worker, which would show that
# UI from its cache; llama-server answers the worker's update check with one that removes itself, and so do we.
SW_REMOVE_JS = """self.addEventListener('install', () => self.skipWaiting());
self.addEventListener('activate', (e) => e.waitUntil((async () => {
    await self.registration.unregister();
    for (const key of await caches.keys()) await caches.delete(key);
    for (const c of await self.clients.matchAll({ type: 'window' })) c.navigate(c.url);
})()));
"""


class StaticPathError(ValueError):
    pass


def page_html() -> bytes:
    return files(__package__).joinpath("webui.html").read_bytes()


def add_page_routes(app: FastAPI, opts: ServerParams) -> None:
    """Call after the API routes: a --path folder is mounted at / and would otherwise shadow them."""
    public = Path(opts.public_path) if opts.public_path else None
    if public is not None and not public.is_dir():
        raise StaticPathError(f"static assets path not found: {opts.public_path}")

    async def service_worker():
        own = public / "sw.js" if public is not None else None
        if own is not None and own.is_file():
            return FileResponse(own, media_type="application/javascript")
        return Response(SW_REMOVE_JS, media_type="application/javascript", headers={"Cache-Control": "no-cache"})

    app.add_api_route("/sw.js", service_worker, methods=["GET"], include_in_schema=False)
    if not opts.webui:
        return
    if public is not None:
        app.mount("/", StaticFiles(directory=public, html=True), name="public_path")
        return
    body = page_html()

    async def page():
        return Response(body, media_type="text/html; charset=utf-8", headers={"Cache-Control": "no-cache"})

    for path in ("/", "/index.html"):
        app.add_api_route(path, page, methods=["GET"], include_in_schema=False)
