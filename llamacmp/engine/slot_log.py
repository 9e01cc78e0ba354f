"""The server's per-request log lines, in llama-server's words (tools/server/server-context.cpp, b8462), so that a
user who reads llama-server's log can read ours, and scripts that grep it ("prompt eval time", "all slots are idle")
keep working.

llama.cpp's heads: `srv  %12.*s: ` and `slot %12.*s: id %2d | task %d | ` with its C function name cut to 12
characters. INFO lines are the default log; DEBUG lines (per token, why a request stopped) need -v.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

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


@dataclass(slots=True)
class StartMarks:
    """Where a request's time to its first token went (perf_counter seconds): when the engine got it, when a slot
    took it, the first prompt chunk's launch and the last one's, and the host time of the MTP head's part of the
    chunks and of graphs captured at the prompt's end (Speculator.prompt_end; 0 with MTP off)."""
    queued: float = 0.0
    assigned: float = 0.0
    prompt0: float = 0.0
    prompt1: float = 0.0                # the last chunk launched (its device work ends by the first token)
    chunks: int = 0
    head_s: float = 0.0
    graphs_s: float = 0.0

    def chunk(self, t0: float, before: tuple[float, float], after: tuple[float, float]) -> None:
        """A prompt chunk launched from t0 to now; before / after: the Speculator's (head, graphs) seconds."""
        self.prompt0 = self.prompt0 if self.chunks else t0
        self.prompt1 = time.perf_counter()
        self.chunks += 1
        self.head_s += after[0] - before[0]
        self.graphs_s += after[1] - before[1]


def start_timeline(slot_id: int, task_id: int, m: StartMarks) -> None:
    """-v: one line per request when its first token is drawn, in ms after the engine got it (queued: a
    perf_counter ms, the clock of benchmarks/server_vs_llamacpp.py's stream marks on the same machine, so a
    client's times line up; benchmarks/mtp_streams.py --timeline reads these lines)."""
    if not log.isEnabledFor(logging.DEBUG):
        return

    def at(t: float) -> str:
        return f"+{1e3 * (t - m.queued):.1f}"
    prompt = f"prompt {at(m.prompt0)} .. {at(m.prompt1)} ({m.chunks} chunks)" if m.chunks else "prompt cached"
    slot_debug("first_token", slot_id, task_id, f"start timeline: queued at {1e3 * m.queued:.1f} ms, "
               f"assigned {at(m.assigned)}, {prompt}, mtp head {1e3 * m.head_s:.1f} ms, "
               f"mtp graphs {1e3 * m.graphs_s:.1f} ms, first token {at(time.perf_counter())}")


def all_idle() -> None:
    log.info("%s", srv("update_slots", "all slots are idle"))
