"""The bridge between asyncio handlers and the engine thread.

Results come back on the engine thread; `sink` hops them onto the handler's event loop. When a handler stops
listening (client gone, stream closed early), its tasks are cancelled at once so their slots are freed.
"""
from __future__ import annotations

import asyncio
from typing import AsyncIterator

from starlette.requests import Request

from ..engine.scheduler import Engine
from ..engine.tasks import CompletionTask, ErrorResult, FinalResult, QueryTask, SlotActionTask


def _loop_sink(loop: asyncio.AbstractEventLoop, q: asyncio.Queue):
    def sink(result) -> None:
        try:
            loop.call_soon_threadsafe(q.put_nowait, result)
        except RuntimeError:            # the loop is closed: nobody is listening any more
            pass
    return sink


class EngineBridge:
    def __init__(self, engine: Engine):
        self.engine = engine

    async def results(self, tasks: list[CompletionTask]) -> AsyncIterator[object]:
        """Submit tasks and yield their results as they come; cancels unfinished tasks when the consumer stops."""
        q: asyncio.Queue = asyncio.Queue()
        sink = _loop_sink(asyncio.get_running_loop(), q)
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
        """All final (or error) results, in index order; watches for a client disconnect meanwhile."""
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
            return []
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

    async def _ask(self, make) -> object:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()

        def sink(value) -> None:
            loop.call_soon_threadsafe(lambda: fut.done() or fut.set_result(value))
        self.engine.submit(make(sink))
        return await asyncio.wait_for(fut, timeout=30)

    async def query(self, kind: str) -> object:
        return await self._ask(lambda sink: QueryTask(kind, sink))

    async def slot_action(self, action: str, id_slot: int, filename: str, filepath: str) -> object:
        return await self._ask(lambda sink: SlotActionTask(action, id_slot, filename, sink, filepath))


async def _disconnected(request: Request) -> bool:
    return await request.is_disconnected()
