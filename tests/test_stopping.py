"""The loop check (backend/stopping.py) on answers the embedded model gave: the texts below are real, from
RidgeFill guided at the app's old defaults (temperature 0, repeat penalty 1.1 over 64 tokens) on the
first 19,500 characters of Node.js's api/http.md (docs/measurements/sampling.md#repeats-in-long-answers)."""
from __future__ import annotations

from backend.stopping import AnswerEnd, LoopWatch, sentence_key

# "What is the default value of keepAliveMsecs?": from item 3 on, two items alternate, their numbers the
# only difference. Up to item 6 each has come twice: the same sentence three times is not there yet.
ALTERNATING = """The default value of keepAliveMsecs is 1024.

Here's a step-by-step breakdown:

1. `keepAlive` is set to 1024 in the Node.js version.
2. The server sends an HTTP request with keepAlive and returns a response with keepAliveMsecs of 1024.
3. The client receives this response, which contains keepAlive headers that contain keepAliveMsecs of 1024.
4. The server then sends another HTTP request with keepAlive to the same server and returns a response with keepAliveMsecs of 1024.
5. The client receives this response, which contains keepAlive headers that contain keepAliveMsecs of 1024.
6. The server then sends another HTTP request with keepAlive to the same server and returns a response with keepAliveMsecs of 1024.
"""

# The same question on the first 19,000 characters: three sentences, then the same three again (a list
# mark in place of a number), the third time with "keepAliveMsecs" for "keepAlive". The model ended it
# itself, at 242 tokens; no sentence came three times.
ROUND_THREE = (
    "The default value of keepAliveMsecs is 10.\n\nHere's a step-by-step breakdown:\n\n1. `keepAlive` is set to "
    "10 in the `createSocket()` method, which means that if you have more than one socket available for "
    "connection creation, it will create a new socket with keepalives of 10.\n\n2. The server uses this default "
    "value when creating a new socket instance and sending data over the network.\n\nSo to summarize:\n\n- "
    "`keepAlive` is set to 10 in the `createSocket()` method, which means that if you have more than one socket "
    "available for connection creation, it will create a new socket with keepalives of 10.\n\n3. The server uses "
    "this default value when creating a new socket instance and sending data over the network.\n\nSo to "
    "summarize:\n\n- `keepAliveMsecs` is set to 10 in the `createSocket()` method, which means that if you have "
    "more than one socket available for connection creation, it will create a new socket with keepalives of 10.")


def fed(text: str, piece: int = 3) -> int | None:
    """Where (characters into `text`) the loop check fed in small pieces, as tokens come, says "loop"."""
    end = AnswerEnd(stop_loops=True)
    for i in range(0, len(text), piece):
        if end.feed(text[i:i + piece]) == "loop":
            return i + piece
    return None


def test_two_items_said_twice_in_a_row_are_a_loop():
    at = fed(ALTERNATING)
    assert at is not None and at > ALTERNATING.index("6. The server"), at  # at item 6, not before
    assert fed(ALTERNATING[: ALTERNATING.index("6. The server")]) is None


def test_three_sentences_said_twice_in_a_row_are_a_loop():
    second = ROUND_THREE.index("So to summarize", ROUND_THREE.index("So to summarize") + 1)
    at = fed(ROUND_THREE)
    assert at is not None and at > second, at  # at the second "So to summarize:", the third sentence again
    assert fed(ROUND_THREE[:second]) is None


def test_a_list_items_number_is_not_what_it_says():
    assert sentence_key("3. The default is X") == sentence_key("7. The default is X") == "the default is x"
    assert sentence_key("**Step 3:** Send request 3 again.") == sentence_key("Step 12: send request 12 again")
    assert sentence_key("4. Send it to 40 hosts") != sentence_key("5. Send it to 50 hosts")  # not numbering
    assert LoopWatch().feed("3. The default is X.\n7. The default is X.\n9. The default is X.\n")
    # the embedded model's days of the week, numbered "01:" (greedy, its prompt's start reused from the cache)
    days = ("Here are the days of the week in a numbered format:\n\n01: Monday\n02: Tuesday\n03: Wednesday\n"
            "04: Thursday\n05: Friday\n06: Saturday\n07: Sunday\n08: Monday\n09: Tuesday\n10: Wednesday\n"
            "11: Thursday\n12: Friday\n13: Saturday\n14: Sunday\n15: Monday\n16: Tuesday\n")
    assert fed(days) == len(days[: days.index("16:")])


def test_what_is_not_a_loop():
    assert not LoopWatch().feed("Yes.\nYes.\nYes.\nYes.\n")  # too short to count
    assert not LoopWatch().feed("}\n}\n}\n}\n  }\n}\n")  # code braces
    code = "if (a) {\n  x();\n}\nif (b) {\n  x();\n}\nif (c) {\n  x();\n}\n"
    assert not LoopWatch().feed(code)
    # one sentence twice, a pair of sentences once again but not in a row
    assert not LoopWatch().feed("The sky is blue. The grass is green. The sky is blue. Water is wet. "
                                "The grass is green. ")
    days = "".join(f"{i}. {d}\n" for i, d in enumerate(
        ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"], 1))
    assert not LoopWatch().feed(days)
    ports = "- Port 80\n- Port 443\n- Port 8080\n"
    assert not LoopWatch().feed(ports)  # numbers that are not the list's


def test_the_same_line_under_other_headings_is_not_a_loop_and_a_section_again_is():
    assert not LoopWatch().feed("**Monday**\n- gym\n**Tuesday**\n- gym\n**Wednesday**\n- gym\n")  # a schedule
    assert not LoopWatch().feed("## Costs\nNot stated in the document.\n## Risks\nNot stated in the document.\n"
                                "## Dates\nNot stated in the document.\n")
    assert LoopWatch().feed("**Monday**\n- gym\n**Monday**\n- gym\n")  # the same section again
    assert LoopWatch().feed("Summary:\nThe sky is blue. The sky is blue. The sky is blue.\n")  # within one section


def test_a_streamed_answer_never_shows_part_of_a_stop_string():
    """What could start a stop string is held until it cannot; the answer is cut before the stop string."""
    end = AnswerEnd(["\n\n", "END"])
    reasons, shown = [], []
    for piece in ["Hello E", "N", "d wor", "ld\n", "x\n", "\nmore"]:
        reasons.append(end.feed(piece))
        shown.append(end.shown())
    assert shown == ["Hello ", "", "ENd wor", "ld", "\nx", ""] and reasons[-1] == "stop"
    assert "".join(shown) == end.text == "Hello ENd world\nx"
    other = AnswerEnd(["xyz"])
    assert [(other.feed(p), other.shown()) for p in ["ab", "x", "y"]] == [(None, "ab"), (None, ""), (None, "")]
    assert other.finish() == "xy" and other.text == "abxy"  # the answer ended otherwise: the held text is given out


def test_an_answers_end_is_held_only_once_the_answer_has_begun():
    end = AnswerEnd(ends=["\n\n"])
    assert [(end.feed(p), end.shown()) for p in ["\n", "\n", "Hi\n", "\nnext"]] == \
        [(None, ""), (None, "\n"), (None, "\nHi"), ("stop", "")]
    assert end.text == "\n\nHi"
