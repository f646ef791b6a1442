"""Whether two answers to the same prompt agree (the GUI's Compare-with-exact and the demo)."""
from __future__ import annotations


def answers_agree(a: str, b: str) -> bool:
    """Same answer up to surrounding white space (greedy decoding makes this a fair test)."""
    return " ".join(a.split()) == " ".join(b.split())
