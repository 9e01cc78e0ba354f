"""The bridge between asyncio handlers and the engine thread.

Results come back on the engine thread; `sink` hops them onto the handler's event loop. When a handler stops
listening (client gone, stream closed early), its tasks are cancelled at once so their slots are freed.
"""
from __future__ import annotations

import asyncio
import threading
from typing import AsyncIterator

from starlette.requests import Request

from ..engine.scheduler import Engine
from ..engine.tasks import (CompletionTask, EmbedTask, ErrorResult, FinalResult, QueryTask, SlotActionTask,
                            WakeTask)
from .errors import ApiError


class _LoopMail:
    """Results for the queues of one event loop, handed over when the engine flushes (Engine.on_results_flush:
    right after it launches a forward, and when it runs out of work): 16 streams get a step's 16 tokens through one
    loop wakeup while the device runs the next step, instead of 16 wakeups (a self-pipe write each, and the loop
    taking the GIL) in the middle of the engine thread's host work."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.items: list[tuple[asyncio.Queue, object]] = []
        self.lock = threading.Lock()

    def sink(self, q: asyncio.Queue):
        def post(result) -> None:
            with self.lock:
                self.items.append((q, result))
        return post

    def flush(self) -> None:
        """(engine thread) hand everything posted so far to the loop."""
        with self.lock:
            items, self.items = self.items, []
        if items:
            try:
                self.loop.call_soon_threadsafe(_deliver, items)
            except RuntimeError:        # the loop is closed: nobody is listening any more
                pass


def _deliver(items: list[tuple[asyncio.Queue, object]]) -> None:
    for q, result in items:
        q.put_nowait(result)


class EngineBridge:
    def __init__(self, engine: Engine):
        self.engine = engine
        self._mail: dict[asyncio.AbstractEventLoop, _LoopMail] = {}
        self._mail_lock = threading.Lock()
        engine.on_results_flush(self._flush)

    def _flush(self) -> None:
        with self._mail_lock:
            boxes = list(self._mail.values())
        for box in boxes:
            box.flush()

    def _mailbox(self, loop: asyncio.AbstractEventLoop) -> _LoopMail:
        with self._mail_lock:
            for old in [lp for lp in self._mail if lp.is_closed()]:   # loops of finished test clients
                del self._mail[old]
            box = self._mail.get(loop)
            if box is None:
                box = self._mail[loop] = _LoopMail(loop)
            return box

    async def results(self, tasks: list[CompletionTask]) -> AsyncIterator[object]:
        """Submit tasks and yield their results as they come; cancels unfinished tasks when the consumer stops."""
        q: asyncio.Queue = asyncio.Queue()
        sink = self._mailbox(asyncio.get_running_loop()).sink(q)
        for t in tasks:
            t.sink = sink
            self.engine.submit(t)
        pending = {t.id for t in tasks}
        try:
            while pending:
                r = await q.get()
                if isinstance(r, (FinalResult, ErrorResult)):
                    pending.discard(r.task_id)
                yield r
        finally:
            for task_id in pending:
                self.engine.cancel(task_id)

    async def collect(self, tasks: list[CompletionTask], request: Request | None) -> list[object]:
        """All final (or error) results, in index order; watches for a client disconnect meanwhile: then the tasks
        are cancelled and ClientGone is raised (no handler sees a partial list)."""
        finals: list[object] = []

        async def gather() -> None:
            async for r in self.results(tasks):
                if isinstance(r, (FinalResult, ErrorResult)):
                    finals.append(r)
        job = asyncio.ensure_future(gather())
        while not job.done():
            await asyncio.wait([job], timeout=0.25)
            if not job.done() and request is not None and await _disconnected(request):
                job.cancel()
                break
        try:
            await job
        except asyncio.CancelledError:
            if not job.cancelled():
                raise
            raise ClientGone(f"client disconnected, task(s) {', '.join(str(t.id) for t in tasks)} cancelled")
        return sorted(finals, key=lambda r: r.index)

    async def first(self, results: AsyncIterator[object], request: Request | None) -> object:
        """The first result of a stream, or None if the client left first (then its tasks are cancelled)."""
        job = asyncio.ensure_future(results.__anext__())
        while not job.done():
            await asyncio.wait([job], timeout=0.25)
            if not job.done() and request is not None and await _disconnected(request):
                job.cancel()                     # runs the generator's finally: its tasks are cancelled
                await asyncio.wait([job])
                return None
        try:
            return job.result()
        except StopAsyncIteration:
            return None

    async def _ask(self, make, timeout: float | None = 30) -> object:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()

        def sink(value) -> None:
            loop.call_soon_threadsafe(lambda: fut.done() or fut.set_result(value))
        self.engine.submit(make(sink))
        return await asyncio.wait_for(fut, timeout=timeout)

    async def query(self, kind: str) -> object:
        r = await self._ask(lambda sink: QueryTask(kind, sink))
        if isinstance(r, ErrorResult):
            raise ApiError(r.message, r.type, r.extra)
        return r

    async def wake(self) -> ErrorResult | None:
        """Wait until a sleeping engine has its model back (as long as the load takes); an ErrorResult if the load
        failed."""
        return await self._ask(WakeTask, timeout=None)

    async def embed(self, prompts: list[list[int]], pooling: str, norm: int) -> object:
        return await self._ask(lambda sink: EmbedTask(prompts, pooling, norm, sink), timeout=None)

    async def slot_action(self, action: str, id_slot: int, filename: str, filepath: str) -> object:
        return await self._ask(lambda sink: SlotActionTask(action, id_slot, filename, sink, filepath))


class ClientGone(Exception):
    """The client of a non-streamed request went away before its results were in; its tasks are cancelled and
    nobody is left to answer (app.py logs one line, no traceback)."""


async def _disconnected(request: Request) -> bool:
    return await request.is_disconnected()
