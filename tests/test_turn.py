"""engine/turn.py: what each drawn token means, for the server's slots and the CLI's Session alike."""
from __future__ import annotations

import numpy as np

from llamacmp.engine.turn import Turn
from llamacmp.sampling import Sampler, SamplingParams

EOG = 9


class Pieces:
    """A stream decoder over a fixed id -> text table."""
    def __init__(self, table):
        self.table = table

    def push(self, tok):
        return self.table[tok]

    def flush(self):
        return ""


TABLE = {0: "He", 1: "llo", 2: " ST", 3: "OP", 4: " more", EOG: ""}


def turn(**kw) -> Turn:
    return Turn(Sampler(SamplingParams(temp=0), frozenset({EOG})), Pieces(TABLE), frozenset({EOG}), **kw)


def test_server_mode_holds_a_partial_stop_and_cuts_at_it():
    t = turn(stops=["STOP"])
    assert [t.accept(x) for x in (0, 1, 2)] == ["He", "llo", ""]        # " ST" may be the start of STOP
    assert t.accept(3) == " " and t.stop_type == "word" and t.text == "Hello " and t.stopping_word == "STOP"


def test_cli_mode_prints_every_piece_and_stops_at_the_tail():
    t = turn(stops=["STOP"], stop_window=0)
    assert [t.accept(x) for x in (0, 1, 2, 3)] == ["He", "llo", " ST", "OP"]
    assert t.stop_type == "word" and t.text == "Hello STOP"
    inner = turn(stops=["mo"], stop_window=0)           # " more": "mo" ends 2 characters before the end
    inner.accept(4)
    assert inner.stop_type == "none"
    wide = turn(stops=["mo"], stop_window=2)            # llama-completion's window of 2 reaches it
    wide.accept(4)
    assert wide.stop_type == "word"


def test_limits_eog_and_a_full_context():
    t = turn(n_predict=2)
    t.accept(0)
    assert t.stop_type == "none"
    t.accept(EOG)
    assert t.stop_type == "eos" and t.eog_token           # EOG wins over the limit reached on the same token
    t = turn()
    t.accept(0, full=True)
    assert t.stop_type == "limit" and t.truncated
    ignore = Turn(Sampler(SamplingParams(temp=0, ignore_eos=True)), Pieces(TABLE), frozenset({EOG}))
    ignore.accept(EOG)
    assert ignore.stop_type == "none"                      # llama.cpp: ignore_eos keeps going


def test_reasoning_budget_forces_the_end():
    t = turn(reasoning_budget=2, reasoning_end=(4, 4))
    t.accept(0)
    assert not t.forced
    t.accept(1)
    assert t.forced == [4, 4] and not t.in_reasoning
    assert t.draw(np.zeros(10, np.float32)) == 4           # forced before the sampler


def test_draw_is_the_greedy_choice():
    assert turn().draw(np.array([0, 1, 5, 2], np.float32)) == 2


def test_forced_tokens_spend_n_predict_only_where_asked():
    server = turn(n_predict=3, reasoning_budget=1, reasoning_end=(4, 4))
    cli = turn(n_predict=3, reasoning_budget=1, reasoning_end=(4, 4), forced_spend_n_predict=False)
    for t in (server, cli):
        t.accept(0)                                        # the one token of thought: the end is forced next
        t.accept(t.draw(None)), t.accept(t.draw(None))      # the two forced tokens
    assert server.stop_type == "limit"                     # max_tokens counts every token of the reply
    assert cli.stop_type == "none" and cli.n_spent == 1    # llama-cli's -n counts the sampled ones
