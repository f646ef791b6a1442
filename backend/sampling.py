"""How the next token is chosen: the sampling parameters of a request, their ranges, and the defaults
a person gets (the model file's recommendation, else the app's set).

Names follow llama.cpp server's /completion. `SamplingParams()` is greedy with every penalty off: what
the demo, evals, bench and tune run (they need the same answer every time). The GUI, the server and
`chat` start from `model_defaults`. The chain itself (llama.cpp's samplers) is backend/sampler.py.
"""
from __future__ import annotations

import math
import secrets
from dataclasses import asdict, dataclass, fields, replace

RANDOM_SEED = -1  # a new seed for each request (llama.cpp's LLAMA_DEFAULT_SEED)
SEED_MODULUS = 0xFFFFFFFF  # llama.cpp's seeds are uint32 and 0xFFFFFFFF means "random": larger ones wrap
# DRY's sequence breakers: a repeat that spans one is not a repeat (llama.cpp's defaults: a new line, a colon,
# a double quote, an asterisk), so "Default:" or a list's line start may come again unpenalized
DRY_SEQUENCE_BREAKERS: tuple[str, ...] = ("\n", ":", "\"", "*")
MAX_BREAKERS = 32
MAX_BREAKER_CHARS = 40  # llama.cpp tokenizes each and caps the tokens it matches on
# The longest penalty or DRY window: llama.cpp sizes their buffers by it (about 8 bytes a token, so 2^31 asked
# for 16 GB); 128K is the longest context the app runs, -1 ("all of it") is the context, and 128K costs 1 MB.
MAX_WINDOW = 131_072
INT32_MAX = 2**31 - 1  # llama.cpp takes top_k as an int32: ctypes would silently wrap a larger one


MAX_FLOAT_INT = 2**1000  # an int from a file beyond this is no sampling setting (float() overflows near 2**1024)


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy: the most likely token, every time
    top_k: int = 0  # keep the k most likely tokens; 0 = off
    top_p: float = 1.0  # keep the most likely tokens whose probabilities sum to p; 1 = off
    min_p: float = 0.0  # drop tokens less likely than min_p x the top token's probability; 0 = off
    repeat_penalty: float = 1.0  # divide the logit of a token seen in the window by this; 1 = off
    repeat_last_n: int = 64  # the penalties' window: the answer's last n tokens; 0 = off, -1 = all of it
    presence_penalty: float = 0.0  # OpenAI's: subtracted once from a token seen in the window
    frequency_penalty: float = 0.0  # OpenAI's: subtracted per time a token was seen in the window
    # DRY ("don't repeat yourself", llama.cpp's): a token that would continue a repeat of what the answer
    # already said is penalized by dry_multiplier * dry_base ** (repeat length - dry_allowed_length), so long
    # repeats are stopped however far apart they are, and single words are free to come again
    dry_multiplier: float = 0.0  # 0 = off
    dry_base: float = 1.75
    dry_allowed_length: int = 2  # a repeat of up to this many tokens is free
    dry_penalty_last_n: int = -1  # the answer's last n tokens DRY looks back on; 0 = off, -1 = all of it
    dry_sequence_breakers: tuple[str, ...] = DRY_SEQUENCE_BREAKERS  # a repeat does not reach back over one
    seed: int = RANDOM_SEED  # the draw of a sampled answer; RANDOM_SEED: a new one each time

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0

    @property
    def penalizes(self) -> bool:
        return self.repeat_last_n != 0 and (self.repeat_penalty != 1.0 or self.presence_penalty != 0.0
                                            or self.frequency_penalty != 0.0)

    @property
    def dry(self) -> bool:
        return self.dry_multiplier > 0.0 and self.dry_penalty_last_n != 0

    def check(self) -> "SamplingParams":
        """Itself, or ValueError naming the first field out of its range (RANGES)."""
        breakers_problem = breakers_error(self.dry_sequence_breakers)
        if breakers_problem:
            raise ValueError(f"dry_sequence_breakers must be {breakers_problem}")
        for f in numeric_fields():
            value = getattr(self, f.name)
            kind = int if f.type in ("int", int) else float
            if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int):
                raise ValueError(f"{f.name} must be {'a number' if kind is float else 'an integer'}, not {value!r}")
            if not isinstance(value, int) and not math.isfinite(value):  # NaN passes every comparison below
                raise ValueError(f"{f.name} must be a finite number, not {value!r}")
            lo, hi = RANGES[f.name]
            if (lo is not None and value < lo) or (hi is not None and value > hi):
                raise ValueError(f"{f.name} must be {range_text(f.name)}, not {value!r}")
        return self

    def with_seed(self) -> "SamplingParams":
        """A concrete seed in place of RANDOM_SEED, so that two runs (compare with exact) draw alike."""
        return self if self.seed != RANDOM_SEED else replace(self, seed=secrets.randbelow(SEED_MODULUS))

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict, base: "SamplingParams | None" = None) -> "SamplingParams":
        """`base` (greedy when None) with the fields of `data` that have the right type and range."""
        out = base or cls()
        breakers = data.get("dry_sequence_breakers") if isinstance(data, dict) else None
        if isinstance(breakers, (list, tuple)) and not breakers_error(breakers):
            out = replace(out, dry_sequence_breakers=tuple(breakers))
        for f in numeric_fields():
            value = data.get(f.name) if isinstance(data, dict) else None
            if value is None or isinstance(value, bool):
                continue
            if isinstance(getattr(out, f.name), float) and isinstance(value, int):
                if not fits_float(value):  # 1 followed by 400 zeros: no float holds it
                    continue
                value = float(value)
            if type(value) is type(getattr(out, f.name)):
                try:
                    out = replace(out, **{f.name: value}).check()
                except ValueError:
                    pass
        return out


GREEDY = SamplingParams()


def fits_float(value) -> bool:
    """`value` is a number a float holds, finite: an int within MAX_FLOAT_INT or a finite float (a file's 1e400
    reads as infinity; float() of 10**400 raises OverflowError)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return abs(value) <= MAX_FLOAT_INT and math.isfinite(float(value))
    except OverflowError:
        return False


def numeric_fields():
    """The fields that are one number each (all but dry_sequence_breakers), in SamplingParams' order."""
    return [f for f in fields(SamplingParams) if f.name != "dry_sequence_breakers"]


def breakers_error(breakers) -> str:
    """What is wrong with a list of DRY sequence breakers ("" when nothing is)."""
    if not isinstance(breakers, (list, tuple)) or len(breakers) > MAX_BREAKERS:
        return f"a list of up to {MAX_BREAKERS} strings"
    if not all(isinstance(b, str) and 0 < len(b) <= MAX_BREAKER_CHARS for b in breakers):
        return f"a list of non-empty strings of up to {MAX_BREAKER_CHARS} characters"
    if not all(is_text(b) for b in breakers):
        return "a list of text strings (one has half a surrogate pair, which llama.cpp cannot take)"
    return ""


def is_text(s: str) -> bool:
    """False for a string with half a surrogate pair (JSON can escape one; UTF-8 cannot hold it)."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True

# (lowest, highest) of each field; None = unbounded. OpenAI's ranges where it has the parameter.
RANGES: dict[str, tuple[float | None, float | None]] = {
    "temperature": (0.0, 2.0),
    "top_k": (0, INT32_MAX),
    "top_p": (0.0, 1.0),
    "min_p": (0.0, 1.0),
    "repeat_penalty": (0.5, 2.0),  # llama.cpp divides by it: it must stay well above 0
    "repeat_last_n": (-1, MAX_WINDOW),
    "presence_penalty": (-2.0, 2.0),
    "frequency_penalty": (-2.0, 2.0),
    "dry_multiplier": (0.0, 5.0),
    "dry_base": (1.0, 4.0),  # llama.cpp turns DRY off below 1
    "dry_allowed_length": (1, MAX_WINDOW),  # a repeat longer than the window is never seen
    "dry_penalty_last_n": (-1, MAX_WINDOW),
    "seed": (RANDOM_SEED, None),
}


def range_text(name: str) -> str:
    lo, hi = RANGES[name]
    return f"{lo} to {hi}" if hi is not None else f"at least {lo}"


# The app's defaults where the file recommends nothing: LM Studio's set at temperature 0, the repeat penalty
# kept to break greedy's loops (docs/measurements/sampling.md#sampling-defaults), and DRY at the values SillyTavern's and
# KoboldCpp's users run, over the whole answer: the penalty's 64 tokens did not reach list items repeated 70 to
# 100 tokens apart. The digits break DRY's sequences too: a number is several tokens, and one the answer says
# again is not a loop ("is set to 1024" had become "is set to 1"; docs/measurements/sampling.md#repeats-in-long-answers).
APP_DRY_BREAKERS = DRY_SEQUENCE_BREAKERS + tuple("0123456789")
APP_DEFAULTS = SamplingParams(temperature=0.0, top_k=40, top_p=0.95, min_p=0.05, repeat_penalty=1.1,
                              repeat_last_n=64, dry_multiplier=0.8, dry_base=1.75, dry_allowed_length=2,
                              dry_penalty_last_n=-1, dry_sequence_breakers=APP_DRY_BREAKERS)

# GGUF's recommended-sampling keys (llama.cpp's LLM_KV_GENERAL_SAMPLING_*) -> our field
GGUF_KEYS = {
    "general.sampling.temp": "temperature",
    "general.sampling.top_k": "top_k",
    "general.sampling.top_p": "top_p",
    "general.sampling.min_p": "min_p",
    "general.sampling.penalty_repeat": "repeat_penalty",
    "general.sampling.penalty_last_n": "repeat_last_n",
}


def recommended(metadata: dict) -> dict:
    """The model file's recommended sampling, as our fields (only the keys it has)."""
    out = {}
    for key, name in GGUF_KEYS.items():
        value = metadata.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            # float32 in the file: 0.95 reads 0.949999988; four places are all a recommendation has
            out[name] = int(value) if isinstance(getattr(GREEDY, name), int) else round(float(value), 4)
    return out


def model_defaults(recommendation: dict) -> tuple[SamplingParams, str]:
    """The sampling a person gets for a model: its file's recommendation (general.sampling.*) over the
    app's defaults, and where it came from, in words."""
    params = SamplingParams.from_dict(recommendation, APP_DEFAULTS)
    if params != APP_DEFAULTS:
        return params, "recommended by the model file"
    return params, "the app's defaults (the model file recommends none)"
