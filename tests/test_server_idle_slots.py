"""--cache-idle-slots / --no-cache-idle-slots (llama-server 0c1e570, where it is on by default; off by default in
llamacmp, whose slots each own their memory; needs -cram): launching a task on one
slot saves every idle slot's state to the host prompt cache and, with -kvu, clears that slot; the next request for
that history is served from the host cache. At -v the server prints llama-server's debug test tags at the same
moments. On the numpy backend with the demo model, through a real server."""
from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from server_harness import LiveServer, ServerProcess

DEMO = Path(__file__).resolve().parents[1] / "llamacmp" / "data" / "default.gguf"
LONG = ("Once upon a time in a land far away, there lived a brave knight who traveled across mountains and rivers "
        "to find the legendary golden sword hidden deep within the enchanted forest of whispers.")
SHORT = "The quick brown fox"
FLAGS = ("-c", "1024", "-np", "2", "-cram", "100", "--slots")
ON = "--cache-idle-slots"


def _complete(c: httpx.Client, prompt: str, **extra) -> dict:
    r = c.post("/completion", json={"prompt": prompt, "n_predict": 4, "temperature": 0, "cache_prompt": True,
                                    **extra}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize("unified", [True, False])
def test_launch_saves_idle_slot_and_clears_it_with_kvu(unified):
    with LiveServer(DEMO, *FLAGS, ON, "-kvu" if unified else "-no-kvu") as srv, httpx.Client(base_url=srv.url) as c:
        eng = srv.ctx.engine
        first = _complete(c, LONG, id_slot=0)
        assert len(eng.host_cache.entries) == 0             # slot 0 was the only one: nothing idle to save
        held = list(eng.slots[0].cache.tokens)
        _complete(c, SHORT, id_slot=1)
        (entry,) = eng.host_cache.entries.values()           # slot 0's history went to the host cache ...
        assert entry.tokens == held
        assert eng.slots[0].cache.tokens == ([] if unified else held)   # ... and only -kvu cleared the slot
        again = _complete(c, LONG)
        assert again["timings"]["cache_n"] > 0 and again["timings"]["prompt_n"] < first["timings"]["prompt_n"]
        assert again["content"] == first["content"]


@pytest.mark.parametrize("flags", [("--no-cache-idle-slots",), ()])      # the flag, and llamacmp's default
def test_no_cache_idle_slots_keeps_idle_slot_in_place(flags):
    with LiveServer(DEMO, *FLAGS, "-kvu", *flags) as srv, httpx.Client(base_url=srv.url) as c:
        eng = srv.ctx.engine
        _complete(c, LONG, id_slot=0)
        held = list(eng.slots[0].cache.tokens)
        _complete(c, SHORT, id_slot=1)
        assert len(eng.host_cache.entries) == 0 and eng.slots[0].cache.tokens == held


def test_cache_ram_off_disables_it_with_llama_servers_warning(caplog):
    with caplog.at_level("WARNING", logger="llamacmp.engine"):
        with LiveServer(DEMO, *FLAGS, ON, "-kvu", "-cram", "0") as srv, httpx.Client(base_url=srv.url) as c:
            _complete(c, LONG, id_slot=0)
            held = list(srv.ctx.engine.slots[0].cache.tokens)
            _complete(c, SHORT, id_slot=1)
            assert srv.ctx.engine.slots[0].cache.tokens == held
    assert "--cache-idle-slots requires --cache-ram, disabling" in caplog.text


def _tags_run(tmp_path: Path, *flags: str) -> list[str]:
    """The log after each of: start, LONG on slot 0, SHORT on slot 1, LONG anywhere."""
    with ServerProcess(DEMO, tmp_path / "log.txt", *FLAGS, "-kvu", *flags) as srv, \
            httpx.Client(base_url=srv.url) as c:
        logs = [srv.log()]
        for prompt, extra in ((LONG, {"id_slot": 0}), (SHORT, {"id_slot": 1}), (LONG, {})):
            _complete(c, prompt, **extra)
            logs.append(srv.log()[sum(map(len, logs)):])
    return logs


def test_debug_tags_at_v(tmp_path):
    start, first, second, third = _tags_run(tmp_path, "-v", ON)
    assert "srv          init: __TEST_TAG_CACHE_IDLE_SLOTS_ENABLED__\n" in start
    assert "__TEST_TAG_CACHE_IDLE_SLOT__" not in first
    assert "slot process_sing: id  0 | task -1 | __TEST_TAG_CACHE_IDLE_SLOT__\n" in second
    assert "srv  get_availabl: updating prompt cache\n" in third


def test_no_tags_without_v_or_with_the_feature_off(tmp_path):
    assert not any("__TEST_TAG" in part or "updating prompt cache" in part for part in _tags_run(tmp_path, ON))
    logs = _tags_run(tmp_path, "-v", "--no-cache-idle-slots")
    assert not any("__TEST_TAG" in part for part in logs)
