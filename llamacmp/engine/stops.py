"""Stop strings (llama.cpp's antiprompts / "stop"): where one ends the generated text, and how much of the text's
end may still grow into one. engine/turn.py asks here."""
from __future__ import annotations

from typing import Sequence


def find_stop(text: str, stops: Sequence[str], since: int = 0) -> tuple[int, str]:
    """Earliest stop string in `text` that ends after index `since` (text[:since] was searched before)
    -> (its absolute index, the string), else (-1, "")."""
    best, word = -1, ""
    for s in stops:
        if not s:
            continue
        i = text.find(s, max(0, since - len(s) + 1))
        if i >= 0 and (best < 0 or i < best):
            best, word = i, s
    return best, word


def partial_stop_len(text: str, stops: Sequence[str]) -> int:
    """Length of the longest suffix of text that is a proper prefix of a stop string (held back while streaming).
    Per stop, only the text's last len(stop) - 1 characters are looked at, and only where the stop's first
    character occurs (str.find / startswith in C): per token O(stops x stop length), whatever the text length."""
    longest = 0
    for s in stops:
        if len(s) < 2:
            continue
        tail = text[-(len(s) - 1):]
        if len(tail) <= longest:
            continue
        i = tail.find(s[0], 0, len(tail) - longest)       # a suffix must be longer than the best so far
        while i >= 0:
            if s.startswith(tail[i:]):
                longest = len(tail) - i
                break
            i = tail.find(s[0], i + 1, len(tail) - longest)
    return longest
