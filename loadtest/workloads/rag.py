"""``rag``: long shared documents, many questions, all in one user message.

Retrieval-augmented generation as clients send it: ``documents`` documents
and ``questions_per_document`` questions about each. Every request is ONE
user message, the document text followed by a blank line, ``Question:`` and
a question of ``question_len`` tokens, answered with ``output_len`` tokens,
behind a short fixed system prompt (``system_prompt``; ``""`` for none). So
the shared prefix — the system prompt and the whole document — sits inside
the user message: a router must hash message content, not only a system
prompt, to see it. Document ``i`` (of ``n``) is ``document_min_len +
(document_max_len - document_min_len) * i / (n - 1)`` tokens long (evenly
spaced; one document is ``document_min_len``).

The ``documents * questions_per_document`` requests are shuffled (seeded),
so the questions about one document arrive spread over the run. A router
that keeps a document on the replica holding it serves all but the first
request's document tokens from cache; a blind one re-computes the document
on every replica it visits.

Defaults: 4 documents of 1500..3000 tokens x 64 questions of 32 tokens,
128-token answers, closed loop at concurrency 16 (or Poisson arrivals at
``rate``). Lengths are words, each exactly one Qwen3 token (see :mod:`.text`).
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass

from loadtest.workloads.base import Conversation, Turn, Workload, paced, pacing_from
from loadtest.workloads.text import words

DEFAULT_SYSTEM = ("Answer the question at the end of the user's message using only the "
                  "document before it. Say so when the document does not hold the answer.")


@dataclass(frozen=True, slots=True)
class RagParams:
    documents: int = 4
    document_min_len: int = 1500
    document_max_len: int = 3000
    questions_per_document: int = 64
    question_len: int = 32
    output_len: int = 128
    system_prompt: str = DEFAULT_SYSTEM
    """The fixed system prompt of every request; ``""``: none."""
    seed: int = 0
    rate: float | None = None
    """Poisson arrivals per second; ``None`` runs closed loop."""
    concurrency: int | None = None
    """Closed loop: requests in flight (default 16). Open loop: cap (default none)."""

    def __post_init__(self) -> None:
        for name in ("documents", "document_min_len", "questions_per_document",
                     "question_len", "output_len"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        if self.document_max_len < self.document_min_len:
            raise ValueError("document_max_len must be at least document_min_len")


def document_lengths(params: RagParams) -> list[int]:
    """Evenly spaced from ``document_min_len`` to ``document_max_len``."""
    if params.documents == 1:
        return [params.document_min_len]
    span = params.document_max_len - params.document_min_len
    return [params.document_min_len + round(span * i / (params.documents - 1))
            for i in range(params.documents)]


def user_message(document: str, question: str) -> str:
    return f"{document}\n\nQuestion: {question}"


def build(params: RagParams) -> Workload:
    conversations = []
    for doc, length in enumerate(document_lengths(params)):
        document = words(f"rag/document/{params.seed}/{doc}", length)
        for number in range(params.questions_per_document):
            question = words(f"rag/question/{params.seed}/{doc}/{number}", params.question_len)
            conversations.append(
                Conversation(
                    id=f"d{doc}-q{number}",
                    group=f"d{doc}",
                    turns=(Turn(user_message(document, question), params.output_len),),
                    system=params.system_prompt or None,
                )
            )
    random.Random(f"rag/order/{params.seed}").shuffle(conversations)
    pacing = pacing_from(params.rate, params.concurrency, default_concurrency=16)
    return Workload(
        name="rag",
        conversations=paced(conversations, pacing, params.seed),
        pacing=pacing,
        params=dataclasses.asdict(params),
    )
