"""Stopping a prep job whose client has left.

Prep work (templating, tokenizing, image decoding, grammar compiling) runs on ServerContext's thread pool. A job
still queued when its client leaves is simply never run; one already running cannot be stopped from outside (Python
has no way to stop a thread), so its steps ask: `step()` between the parts of a job raises `Abandoned` once the
client is gone, and the thread is free for the next request instead of finishing work nobody will read.
"""
from __future__ import annotations

import threading

_job = threading.local()


class Abandoned(Exception):
    """The client of the prep job running on this thread has left."""


def run(left: threading.Event, fn, *args):
    """fn(*args) on this (pool) thread, with `left` as the signal its steps check."""
    _job.left = left
    try:
        return fn(*args)
    finally:
        _job.left = None


def step() -> None:
    """A step boundary of a prep job: raises Abandoned if its client has left (nothing outside a job)."""
    left = getattr(_job, "left", None)
    if left is not None and left.is_set():
        raise Abandoned()
