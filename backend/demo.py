"""The headless demo: a long document from the shipped corpus with one fact buried in it, one question."""
from __future__ import annotations

from dataclasses import dataclass

from .corpus import corpus_texts

DEMO_FACT = "The code of the harbour archive's old vault is 4729185."
DEMO_QUESTION = "What is the code of the harbour archive's old vault? Answer with the number only."
DEMO_ANSWER = "4729185"


@dataclass
class DemoDocument:
    text: str
    n_tokens: int  # of the document alone, with the model's tokenizer
    fact_depth: float  # where the fact sits, as a share of the document


def demo_document(tokenize, n_tokens: int = 4000, depth: float = 0.3) -> DemoDocument:
    """About n_tokens of corpus prose with DEMO_FACT inserted between paragraphs at `depth`."""
    paragraphs = [p.strip() for text in corpus_texts() for p in text.split("\n\n") if p.strip()]
    chosen, total = [], 0
    for p in paragraphs:
        cost = len(tokenize(p + "\n\n"))
        if total + cost > n_tokens:
            break
        chosen.append(p)
        total += cost
    at = max(1, round(len(chosen) * depth))
    chosen.insert(at, DEMO_FACT)
    text = "\n\n".join(chosen)
    return DemoDocument(text=text, n_tokens=len(tokenize(text)), fact_depth=at / len(chosen))
