"""Needle-in-a-haystack items (RULER's NIAH style) cut to an exact token count with the model's tokenizer.

An item is one chat prompt: a fixed instruction, a haystack with needles ("The special magic number for
<key> is <7 digits>.") at chosen token depths, and the question last. Its length is the token count of
the whole chat-formatted prompt exactly as `Engine.prompt_tokens` makes it, and every needle knows the
prompt token positions it covers, so it can be labelled bulk (approximated) or tail (exact) for a tail T.
Everything is seeded: the same arguments give the same items on any machine.
"""
from __future__ import annotations

import functools
import random
import re
import uuid as uuid_mod
from dataclasses import asdict, dataclass, field
from typing import Callable

from ..errors import RidgeFillError
from ..protocol import ChatMessage, CompletionRequest
from .haystacks import Haystack

VARIANTS = ("single", "multikey", "multivalue", "uuid")
MULTIKEY_N = 4  # needles with distinct keys, one asked
MULTIVALUE_N = 3  # values for one key, all asked

# Wording kept fixed: checked on SmolLM2-135M-Instruct, which answers it with the bare number.
INTRO = (
    "Some special magic numbers are hidden within the following text. Make sure to memorize them. "
    "I will quiz you about the numbers afterwards."
)
NEEDLE = {"number": "The special magic number for {key} is {value}.", "uuid": "The special magic uuid for {key} is {value}."}
QUESTION = {
    "number": "What is the special magic number for {key}? Answer with the number only.",
    "uuid": "What is the special magic uuid for {key}? Answer with the uuid only.",
    "numbers": "What are all the special magic numbers for {key}? Answer with the numbers only.",
}
# A base model (no chat template in its GGUF) is not asked a question it was never taught to answer:
# its prompt ends in the start of the answer, as RULER does for base models. Gemma 3 270M, which ships
# without a template, answered 0 of 2 needle items asked the chat way.
ANSWER_CUE = {
    "number": "Answer: The special magic number for {key} is",
    "uuid": "Answer: The special magic uuid for {key} is",
    "numbers": "Answer: The special magic numbers for {key} are",
}
# Keys: plain, distinct single words (RULER draws random words).
KEYS = (
    "apple river lantern meadow copper falcon harbor violet thunder pebble orchard compass marble "
    "willow ember glacier saffron beacon cobalt juniper quartz tundra velvet anchor prism sparrow "
    "canyon fern harvest ivory kettle lagoon mosaic nectar oyster pepper quill raven summit tulip "
    "umbrella walnut yarrow zephyr badger cedar dune garnet hazel"
).split()


class NeedleError(RidgeFillError):
    """An item that cannot be built as asked (too short, bad depth, unknown variant)."""


@dataclass
class Needle:
    key: str
    value: str
    start: int  # prompt token index of the needle's first token
    end: int  # one past its last token
    asked: bool


@dataclass
class NeedleItem:
    id: str
    variant: str
    length: int  # tokens of the whole chat prompt, exactly
    depth: float  # where the asked needle sits in the haystack (0 = start, 1 = end)
    haystack: str
    seed: int
    rep: int
    key: str
    answers: list[str]  # what a correct reply must contain (all of them for multivalue)
    needles: list[Needle]
    messages: list[ChatMessage] = field(repr=False)
    max_tokens: int = 24
    prompt: str | None = field(default=None, repr=False)  # a base model's plain prompt, ending in the answer cue
    document: str | None = None  # items of one document share its rows (backend/recall/prefix_snapshot.py)

    @property
    def asked(self) -> list[Needle]:
        return [n for n in self.needles if n.asked]

    @property
    def needle_pos(self) -> int:
        """Token position of the (first) asked needle."""
        return min(n.start for n in self.asked)

    def region(self, tail: int | None) -> str:
        return needle_region(self.asked, self.length, tail)

    def request(self, mode: str = "off", split: int | None = None, tail: int | None = None) -> CompletionRequest:
        # No prefix reuse: every item is timed and approximated from scratch. Greedy (the request's default
        # sampling, penalties off): recall, sweeps, bench and tune compare answers, which must not vary by draw.
        asked = {"prompt": self.prompt} if self.prompt is not None else {"messages": self.messages}
        return CompletionRequest(**asked, max_tokens=self.max_tokens, mode=mode, split=split, tail=tail,
                                 reuse_prefix=False)

    def meta(self, tail: int | None) -> dict:
        """The fields every result line carries about its item."""
        return {
            "id": self.id, "variant": self.variant, "length": self.length, "depth": self.depth,
            "haystack": self.haystack, "seed": self.seed, "rep": self.rep, "key": self.key,
            "expected": list(self.answers), "needle_pos": self.needle_pos,
            "needles": [asdict(n) for n in self.needles], "region": self.region(tail),
        }


def needle_region(needles: list[Needle], length: int, tail: int | None) -> str:
    """'bulk' when every token of every given needle is a bulk row (a position with at least `tail`
    prompt tokens after it, i.e. < length - tail), else 'tail'. A needle that straddles the boundary
    counts as tail: part of it was computed exactly, so it cannot stand for the approximation."""
    if not tail:
        return "tail"  # no tail given: nothing is labelled approximated
    boundary = length - tail
    return "bulk" if all(n.end <= boundary for n in needles) else "tail"


# ---- building ---------------------------------------------------------------------------------
_SENT_END = re.compile(rb"[.!?][\"')\]]*$")


class _TokenHaystack:
    """The haystack tokenized once (cycled to at least `need` tokens), with the token indices where a
    sentence ends and the next token starts with whitespace: the places a needle may go."""

    def __init__(self, engine, haystack: Haystack, need: int):
        text = haystack.text
        tokens = engine.tokenize(text, add_special=False)
        if not tokens:
            raise NeedleError(f"haystack {haystack.name} is empty")
        reps = 1
        while len(tokens) < need:
            reps = max(reps + 1, int(reps * need / max(1, len(tokens))) + 1)
            text = "\n\n".join([haystack.text] * reps)
            tokens = engine.tokenize(text, add_special=False)
        self.tokens = tokens
        self.pieces = [engine.token_bytes(t) for t in tokens]
        self.points = [0] + [
            i for i in range(1, len(tokens))
            if self.pieces[i][:1] in (b" ", b"\n") and _SENT_END.search(self.pieces[i - 1])
        ]
        if len(self.points) < 2:
            raise NeedleError(f"haystack {haystack.name} has no sentence ends to put needles after")

    def text(self, a: int, b: int) -> str:
        return b"".join(self.pieces[a:b]).decode("utf-8", "replace")

    def point_near(self, pos: float, limit: int) -> int:
        """The insertion point (<= limit) nearest to token position `pos`; `limit` itself (the end) counts."""
        cands = [p for p in self.points if p <= limit] + [limit]
        return min(cands, key=lambda p: (abs(p - pos), p))


def _join(a: str, b: str) -> str:
    if not a or not b or a[-1].isspace() or b[0].isspace():
        return a + b
    return a + " " + b


def _content(hay: _TokenHaystack, start: int, end: int, placed: list[tuple[int, str]]) -> tuple[str, list[tuple[int, int]]]:
    """Haystack tokens [start, end) with each needle text inserted before haystack token index p
    (a p outside the window puts the needle at that edge). Returns the message text and each
    needle's (start, end) character span in it, in `placed` order."""
    at = sorted((min(max(p, start), end), i) for i, (p, _) in enumerate(placed))
    text, prev = "", start
    spans: list[tuple[int, int]] = [(0, 0)] * len(placed)
    for p, i in at:
        text = _join(text, hay.text(prev, p).lstrip() if prev == start else hay.text(prev, p))
        needle = placed[i][1]
        sep = "" if (not text or text[-1].isspace()) else " "
        first = len(text) + len(sep)
        text = text + sep + needle
        spans[i] = (first, first + len(needle))
        prev = p
    rest = hay.text(prev, end)
    # No whitespace at either edge: runs of newlines merge unpredictably with the frame's "\n\n".
    text = _join(text, (rest.lstrip() if prev == start else rest).rstrip())
    head = INTRO + "\n\n"
    return head + text, [(s + len(head), e + len(head)) for s, e in spans]


def token_spans(engine, prompt_text: str, tokens: list[int], spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Map character spans of `prompt_text` to token index spans of its tokenization."""
    pieces = [engine.token_bytes(t, special=True) for t in tokens]
    joined = b"".join(pieces)
    text_bytes = prompt_text.encode("utf-8")
    shift = joined.find(text_bytes)  # > 0 when the tokenizer added a BOS the text does not hold
    if shift < 0:
        raise NeedleError("the tokenizer does not round-trip this prompt; needle positions are unknown")
    ends, acc = [], 0
    for p in pieces:
        acc += len(p)
        ends.append(acc)
    out = []
    for s, e in spans:
        bs = shift + len(prompt_text[:s].encode("utf-8"))
        be = shift + len(prompt_text[:e].encode("utf-8"))
        first = next(i for i, end in enumerate(ends) if end > bs)
        last = next(i for i, end in enumerate(ends) if end >= be)
        out.append((first, last + 1))
    return out


def _values(rng: random.Random, kind: str, n: int) -> list[str]:
    vals: list[str] = []
    while len(vals) < n:
        v = str(uuid_mod.UUID(int=rng.getrandbits(128), version=4)) if kind == "uuid" else str(rng.randint(1_000_000, 9_999_999))
        if v not in vals:
            vals.append(v)
    return vals


def build_item(engine, *, length: int, depth: float, variant: str = "single", haystack: Haystack,
               seed: int = 0, rep: int = 0, _hay_cache: dict | None = None) -> NeedleItem:
    """One item whose chat prompt is exactly `length` tokens for `engine`'s tokenizer and template."""
    if variant not in VARIANTS:
        raise NeedleError(f"unknown variant {variant!r}; choose from {', '.join(VARIANTS)}")
    if not 0.0 <= depth <= 1.0:
        raise NeedleError(f"depth {depth} is outside 0..1 (a share of the haystack)")
    engine.check_fits(length, 16)
    item_id = f"{haystack.name}-{variant}-L{length}-D{depth:g}-r{rep}-s{seed}"
    plan = _plan_needles(random.Random(item_id), variant, depth)  # str seeds are hashed deterministically (sha512)
    cue = None if engine.info.chat_template else ANSWER_CUE[plan.asking].format(key=plan.key)
    frame = _Frame(engine, QUESTION[plan.asking].format(key=plan.key), cue)
    texts = [NEEDLE[plan.kind].format(key=k, value=v) for k, v, _ in plan.needles]

    overhead = len(engine.prompt_tokens(frame.asked(INTRO + "\n\n" + frame.question)[2]))
    needle_tokens = sum(len(engine.tokenize(" " + t, add_special=False)) for t in texts)
    budget = length - overhead - needle_tokens
    if budget < 32:
        raise NeedleError(f"{length} tokens is too short for a {variant} item (the frame alone takes "
                          f"{overhead + needle_tokens}); use at least {overhead + needle_tokens + 32}")
    hay = _token_haystack(engine, haystack, length, _hay_cache)
    found = _cut_to_length(frame, hay, length, budget, plan.depths, texts)
    if found is None:
        raise NeedleError(f"could not cut the {variant} item {item_id} to exactly {length} tokens")
    messages, text, tokens, spans = found

    tok_spans = token_spans(engine, text, tokens, spans)
    out = [Needle(k, v, s, e, asked) for (k, v, asked), (s, e) in zip(plan.needles, tok_spans)]
    return NeedleItem(id=item_id, variant=variant, length=length, depth=depth, haystack=haystack.name,
                      seed=seed, rep=rep, key=plan.key, answers=plan.answers, needles=out, messages=messages,
                      max_tokens=plan.max_tokens, prompt=text if cue is not None else None)


@dataclass
class _NeedlePlan:
    """What an item hides and asks, drawn from its seeded generator."""
    kind: str  # the values: "number" or "uuid"
    asking: str  # the QUESTION / ANSWER_CUE wording
    key: str  # the asked key
    needles: list[tuple[str, str, bool]]  # (key, value, asked), in the order they are placed
    depths: list[float]  # each needle's depth in the haystack
    answers: list[str]
    max_tokens: int


def _plan_needles(rng: random.Random, variant: str, depth: float) -> _NeedlePlan:
    """The variant's needles; the draws from `rng` come in a fixed order, so an item id gives one plan."""
    kind = "uuid" if variant == "uuid" else "number"
    if variant == "multikey":
        keys = rng.sample(KEYS, MULTIKEY_N)
        values = _values(rng, kind, MULTIKEY_N)
        needles = [(keys[i], values[i], i == 0) for i in range(MULTIKEY_N)]
        depths = [depth] + [rng.random() for _ in range(MULTIKEY_N - 1)]
        return _NeedlePlan(kind, "number", keys[0], needles, depths, [values[0]], 24)
    if variant == "multivalue":
        key = rng.choice(KEYS)
        values = _values(rng, kind, MULTIVALUE_N)
        # the first value at `depth`, the others close after it (same region unless near the boundary)
        depths = [depth] + [min(1.0, depth + 0.02 * (i + 1) + 0.01 * rng.random()) for i in range(MULTIVALUE_N - 1)]
        return _NeedlePlan(kind, "numbers", key, [(key, v, True) for v in values], depths, values, 16 * MULTIVALUE_N)
    key = rng.choice(KEYS)
    values = _values(rng, kind, 1)
    return _NeedlePlan(kind, kind, key, [(key, values[0], True)], [depth], values, 56 if kind == "uuid" else 24)


@dataclass
class _Frame:
    """How an item's content becomes its prompt: the chat template, or for a base model (`cue` given) a
    plain prompt ending in the answer cue."""
    engine: object
    question: str
    cue: str | None

    def asked(self, content: str) -> tuple[list[ChatMessage], str, CompletionRequest]:
        """The user message, the prompt text and its request."""
        messages = [ChatMessage("user", content)]
        if self.cue is None:
            return messages, self.engine.format_chat(messages), CompletionRequest(messages=messages)
        text = content + "\n\n" + self.cue
        return messages, text, CompletionRequest(prompt=text)

    def prompt(self, hay: _TokenHaystack, start: int, end: int,
               placed) -> tuple[list[ChatMessage], str, list[int], list[tuple[int, int]]]:
        """The prompt of haystack window [start, end) with the needles `placed`: its messages, text,
        tokens and each needle's character span in the text."""
        content, spans = _content(hay, start, end, placed)
        content = content + "\n\n" + self.question
        messages, text, req = self.asked(content)
        base = text.index(content)
        return messages, text, self.engine.prompt_tokens(req), [(s + base, e + base) for s, e in spans]

    def n_tokens(self, hay: _TokenHaystack, start: int, placed, end: int) -> int:
        return len(self.prompt(hay, start, end, placed)[2])


def _token_haystack(engine, haystack: Haystack, length: int, cache: dict | None) -> _TokenHaystack:
    """The tokenized haystack from `cache` (by name), made anew when missing or too short for `length`."""
    cache = cache if cache is not None else {}
    hay = cache.get(haystack.name)
    if hay is None or len(hay.tokens) < 2 * length:  # room for the window to start later
        hay = cache[haystack.name] = _TokenHaystack(engine, haystack, 2 * length)
    return hay


def _cut_to_length(frame: _Frame, hay: _TokenHaystack, length: int, budget: int, depths: list[float],
                   texts: list[str]):
    """The prompt (as `_Frame.prompt`) of exactly `length` tokens, or None.

    The haystack is a window [start, start + budget) of the cycled text, needles at the sentence ends
    nearest their depths. Token counts of pieces do not add up exactly (merges at the joins, runs of
    newlines), so the window's end moves until the prompt is exactly `length` tokens; where that end
    cannot hit it (a paragraph break costs several tokens at once), the window starts one sentence later."""
    for start in hay.points[:12]:
        placed = [(hay.point_near(start + d * budget, start + budget), t) for d, t in zip(depths, texts)]
        count = functools.cache(functools.partial(frame.n_tokens, hay, start, placed))
        end = _end_at_length(count, start, start + budget, length)
        if end is not None:
            return frame.prompt(hay, start, end, placed)
    return None


def _end_at_length(count: Callable[[int], int], start: int, end: int, length: int) -> int | None:
    """A window end whose prompt `count`s exactly `length` tokens: a few steps by the miss from `end`,
    then the nearest within 8 tokens of where they stopped; None when there is none."""
    for _ in range(8):
        n = count(end)
        if n == length:
            break
        end = max(start + 1, end + length - n)
    if count(end) != length:
        end = next((e for e in sorted(range(end - 8, end + 9), key=lambda e: abs(e - end))
                    if e > start and count(e) == length), None)
    return end


def make_items(engine, *, lengths: list[int], depths: list[float], variants: list[str], haystack: Haystack,
               reps: int = 1, seed: int = 0) -> list[NeedleItem]:
    """The full grid, in a stable order (length, depth, variant, rep)."""
    cache: dict = {}
    return [
        build_item(engine, length=L, depth=d, variant=v, haystack=haystack, seed=seed, rep=r, _hay_cache=cache)
        for L in lengths for d in depths for v in variants for r in range(reps)
    ]
