"""The server's per-request log lines, in llama-server's words (tools/server/server-context.cpp, b8462), so that a
user who reads llama-server's log can read ours, and scripts that grep it ("prompt eval time", "all slots are idle")
keep working.

llama.cpp's heads: `srv  %12.*s: ` and `slot %12.*s: id %2d | task %d | ` with its C function name cut to 12
characters. INFO lines are the default log; DEBUG lines (per token, why a request stopped) need -v.
"""
from __future__ import annotations

import logging

from .tasks import Timings

log = logging.getLogger("llamacmp.engine")


def srv(func: str, msg: str) -> str:
    return f"srv  {func[:12]:>12}: {msg}"


def slot_head(func: str, slot_id: int, task_id: int) -> str:
    return f"slot {func[:12]:>12}: id {slot_id:2d} | task {task_id} | "


def slot_info(func: str, slot_id: int, task_id: int, msg: str) -> None:
    log.info("%s%s", slot_head(func, slot_id, task_id), msg)


def srv_debug(func: str, msg: str) -> None:
    """llama-server's SRV_DBG / SRV_TRC lines: shown at -v (llamacmp's DEBUG covers both of its levels)."""
    if log.isEnabledFor(logging.DEBUG):
        log.debug("%s", srv(func, msg))


def slot_debug(func: str, slot_id: int, task_id: int, msg: str) -> None:
    if log.isEnabledFor(logging.DEBUG):
        log.debug("%s%s", slot_head(func, slot_id, task_id), msg)


def _per_token(ms: float, n: int) -> float:
    """C's ms / n: x/0 is inf and 0/0 nan, which printf writes as 'inf' / 'nan'."""
    return ms / n if n else (float("nan") if ms == 0 else float("inf"))


def _per_second(ms: float, n: int) -> float:
    """C's 1e3 / ms * n (inf * 0 is nan)."""
    return 1e3 / ms * n if ms else (float("nan") if n == 0 else float("inf"))


def timings_block(t: Timings) -> str:
    """llama-server's print_timings block: a blank head line, then prompt eval, eval and total."""
    return ("\n"
            f"prompt eval time = {t.prompt_ms:10.2f} ms / {t.prompt_n:5d} tokens ({_per_token(t.prompt_ms, t.prompt_n):8.2f}"
            f" ms per token, {_per_second(t.prompt_ms, t.prompt_n):8.2f} tokens per second)\n"
            f"       eval time = {t.predicted_ms:10.2f} ms / {t.predicted_n:5d} tokens "
            f"({_per_token(t.predicted_ms, t.gen_steps):8.2f} ms per token, "
            f"{_per_second(t.predicted_ms, t.gen_steps):8.2f} tokens per second)\n"
            f"      total time = {t.prompt_ms + t.predicted_ms:10.2f} ms / {t.prompt_n + t.predicted_n:5d} tokens")


def print_timings(slot_id: int, task_id: int, t: Timings) -> None:
    log.info("%s%s", slot_head("print_timings", slot_id, task_id), timings_block(t))
    if t.draft.n > 0:                   # llama-server 0c1e570 adds this line after a request that drafted
        slot_info("print_timings", slot_id, task_id, t.draft.acceptance_line())


def all_idle() -> None:
    log.info("%s", srv("update_slots", "all slots are idle"))
