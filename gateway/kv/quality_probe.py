"""The built-in quality probe: a baseline and a candidate endpoint on the shipped corpus.

No download: the corpus is ``gateway/kv/corpus/<language>.txt`` (English,
French, German, Spanish, Chinese; a few paragraphs each, ``# title`` lines
between passages), written for this project. Both endpoints must serve the
same model (same tokens) and speak vLLM's ``/v1/completions`` extensions:
``prompt_logprobs`` and ``return_token_ids``.

Per passage, four requests, all greedy (``temperature`` 0):

1. baseline: the passage as prompt, ``prompt_logprobs=0``, ``max_tokens=G``:
   the log-probability of every passage token given the ones before it, and
   the baseline's greedy continuation ``c`` (``G`` tokens, default 32);
2. candidate: the same request: its log-probabilities on the same tokens
   (the token ids must match, else the endpoints serve different models) and
   its own greedy continuation;
3. candidate, teacher-forced: the passage's token ids followed by ``c`` as
   prompt, ``prompt_logprobs=1``: at each position of ``c``, does the
   candidate's most likely token equal the baseline's?
4. the noise floor: candidate, teacher-forced on its *own* continuation
   ``c'``: does it rank first the tokens it just generated itself? An
   endpoint judged against itself is not at 100%: a token generated while
   decoding and the same token scored in a prefill are computed in different
   batches and kernels, so near-ties flip (vLLM on CPU: about 3% of
   SmolLM2's continuation tokens). The same request also scores the passage
   a second time, for the perplexity's floor.

Figures, over all passages (token-weighted):

* mean log-prob difference ``Δ = mean(lp_candidate) − mean(lp_baseline)``
  in nats per token (negative: the candidate finds the text less likely);
* perplexity ratio ``exp(−mean lp_c) / exp(−mean lp_b) = exp(−Δ)``;
* greedy token agreement: the share of the baseline's continuation tokens
  the candidate also ranks first given the same context (3.). Unlike
  comparing the two free-running continuations, one early difference does
  not count against every later token; the free-running figure (tokens
  equal before the first difference, as a share of ``G``) is reported too.

As gate checks (``gateway.kv.gate``): perplexity, where the relative drop is
``ratio − 1``, and greedy agreement, where it is ``1 − agreement``. Each
carries its noise floor (4.: ``1 − self-agreement`` and ``|self-ratio − 1|``),
and the gate judges the drop beyond it: comparing an endpoint with itself
then shows a drop of about its floor and passes, where it used to report a
"2.7% drop" of greedy agreement.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from gateway.kv.gate import Check

CORPUS_DIR = Path(__file__).with_name("corpus")
EMULATION_MARK = "emulation"


class QualityProbeError(RuntimeError):
    """An endpoint answered something the probe cannot use (the message says what)."""


@dataclass(frozen=True, slots=True)
class Passage:
    language: str
    title: str
    text: str


def load_corpus(folder: Path = CORPUS_DIR, per_language: int | None = None) -> tuple[Passage, ...]:
    """Every ``*.txt`` in ``folder``; ``# title`` lines start passages; the file name is the language.
    """
    passages: list[Passage] = []
    for path in sorted(folder.glob("*.txt")):
        found: list[Passage] = []
        title, lines = "", list[str]()
        for line in [*path.read_text(encoding="utf-8").splitlines(), "# "]:
            if line.startswith("# "):
                if " ".join(lines).strip():
                    found.append(Passage(path.stem, title, "\n".join(lines).strip()))
                title, lines = line[2:].strip(), []
            else:
                lines.append(line)
        passages += found[:per_language] if per_language else found
    if not passages:
        raise QualityProbeError(f"no passages in {folder}")
    return tuple(passages)


@dataclass(frozen=True, slots=True)
class Endpoint:
    url: str
    """Base URL, with or without ``/v1``."""
    model: str
    api_key: str | None = None

    @property
    def completions_url(self) -> str:
        base = self.url.rstrip("/")
        return (base if base.endswith("/v1") else base + "/v1") + "/completions"


@dataclass(frozen=True, slots=True)
class Scored:
    """One endpoint's answer to one request."""

    prompt_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    """Of prompt tokens 1..n-1 (the first token has none)."""
    top1: tuple[int | None, ...]
    """The rank-1 token at each of those positions, when the entry lists it."""
    continuation: tuple[int, ...]
    text: str
    fingerprint: str


def parse_choice(body: Mapping[str, Any]) -> Scored:
    """vLLM's completion answer -> :class:`Scored`; :class:`QualityProbeError` when a field
    is missing."""
    try:
        choice = body["choices"][0]
        ids = tuple(int(t) for t in choice["prompt_token_ids"])
        entries = choice["prompt_logprobs"]
    except (KeyError, IndexError, TypeError):
        raise QualityProbeError("the answer has no prompt_logprobs / prompt_token_ids: the "
                                "endpoint must be vLLM (or speak its extensions)") from None
    logprobs: list[float] = []
    top1: list[int | None] = []
    for token, entry in zip(ids[1:], entries[1:]):
        if not entry or str(token) not in entry:
            raise QualityProbeError(f"prompt_logprobs has no entry for token {token}")
        logprobs.append(float(entry[str(token)]["logprob"]))
        top1.append(next((int(k) for k, v in entry.items() if v.get("rank") == 1), None))
    return Scored(ids, tuple(logprobs), tuple(top1), tuple(int(t) for t in choice.get("token_ids")
                                                           or ()),
                  str(choice.get("text", "")), str(body.get("system_fingerprint") or ""))


class QualityProbeClient:
    """Synchronous HTTP to the two endpoints (a CLI, not the gateway's event loop)."""

    def __init__(self, timeout: float = 300.0,
                 transport: httpx.BaseTransport | None = None) -> None:
        self.http = httpx.Client(timeout=timeout, transport=transport)

    def close(self) -> None:
        self.http.close()

    def complete(self, endpoint: Endpoint, prompt: str | Sequence[int], max_tokens: int,
                 prompt_logprobs: int) -> Scored:
        body = {"model": endpoint.model, "prompt": prompt if isinstance(prompt, str) else
                list(prompt), "max_tokens": max_tokens, "temperature": 0,
                "prompt_logprobs": prompt_logprobs, "return_token_ids": True}
        headers = {"Authorization": f"Bearer {endpoint.api_key}"} if endpoint.api_key else {}
        try:
            answer = self.http.post(endpoint.completions_url, json=body, headers=headers)
        except httpx.HTTPError as exc:
            raise QualityProbeError(f"{endpoint.completions_url}: {exc}") from None
        if answer.status_code != 200:
            raise QualityProbeError(f"{endpoint.completions_url} answered {answer.status_code}: "
                                    f"{answer.text[:300]}")
        return parse_choice(answer.json())


@dataclass(frozen=True, slots=True)
class PassageScore:
    language: str
    title: str
    tokens: int
    baseline_logprob: float
    """Sum over the passage's scored tokens."""
    candidate_logprob: float
    agreement_hits: int
    agreement_total: int
    free_run_match: int
    """Continuation tokens equal in both free-running continuations before the first difference."""
    baseline_text: str
    candidate_text: str
    floor_hits: int = 0
    """Of the candidate's own continuation tokens, those it ranks first teacher-forced (4.)."""
    floor_total: int = 0
    floor_logprob: float = 0.0
    """The candidate's passage log-prob, scored a second time (4.)."""


@dataclass(frozen=True, slots=True)
class QualityProbeSummary:
    tokens: int
    mean_logprob_baseline: float
    mean_logprob_candidate: float
    greedy_agreement: float
    free_run_agreement: float
    floor_agreement: float = 1.0
    """The candidate's agreement with itself (the noise floor of ``greedy_agreement``)."""
    mean_logprob_floor: float | None = None
    """The candidate's mean log-prob, scored a second time."""

    @property
    def floor_perplexity_ratio(self) -> float:
        """The candidate's perplexity, scored twice: how far apart two equal runs are."""
        if self.mean_logprob_floor is None:
            return 1.0
        return math.exp(-(self.mean_logprob_floor - self.mean_logprob_candidate))

    @property
    def mean_logprob_diff(self) -> float:
        return self.mean_logprob_candidate - self.mean_logprob_baseline

    @property
    def perplexity_baseline(self) -> float:
        return math.exp(-self.mean_logprob_baseline)

    @property
    def perplexity_candidate(self) -> float:
        return math.exp(-self.mean_logprob_candidate)

    @property
    def perplexity_ratio(self) -> float:
        return math.exp(-self.mean_logprob_diff)

    def as_dict(self) -> dict[str, Any]:
        return {"tokens": self.tokens, "mean_logprob_baseline": self.mean_logprob_baseline,
                "mean_logprob_candidate": self.mean_logprob_candidate,
                "mean_logprob_diff": self.mean_logprob_diff,
                "perplexity_baseline": self.perplexity_baseline,
                "perplexity_candidate": self.perplexity_candidate,
                "perplexity_ratio": self.perplexity_ratio,
                "greedy_agreement": self.greedy_agreement,
                "free_run_agreement": self.free_run_agreement,
                "noise_floor": {"greedy_agreement": self.floor_agreement,
                                "perplexity_ratio": self.floor_perplexity_ratio}}


def summarize(scores: Iterable[PassageScore]) -> QualityProbeSummary:
    scores = list(scores)
    tokens = sum(s.tokens for s in scores)
    total = sum(s.agreement_total for s in scores)
    if not tokens or not total:
        raise QualityProbeError("nothing was scored")
    floor_total = sum(s.floor_total for s in scores)
    return QualityProbeSummary(
        tokens=tokens,
        mean_logprob_baseline=sum(s.baseline_logprob for s in scores) / tokens,
        mean_logprob_candidate=sum(s.candidate_logprob for s in scores) / tokens,
        greedy_agreement=sum(s.agreement_hits for s in scores) / total,
        free_run_agreement=sum(s.free_run_match for s in scores) / total,
        floor_agreement=sum(s.floor_hits for s in scores) / floor_total if floor_total else 1.0,
        mean_logprob_floor=sum(s.floor_logprob for s in scores) / tokens if floor_total
        else None,
    )


@dataclass(frozen=True, slots=True)
class QualityProbeResult:
    passages: tuple[PassageScore, ...]
    baseline_fingerprint: str
    candidate_fingerprint: str

    @property
    def emulation(self) -> bool:
        return any(EMULATION_MARK in f for f in (self.baseline_fingerprint,
                                                 self.candidate_fingerprint))

    @property
    def summary(self) -> QualityProbeSummary:
        return summarize(self.passages)

    def by_language(self) -> dict[str, QualityProbeSummary]:
        languages = sorted({p.language for p in self.passages})
        return {lang: summarize(p for p in self.passages if p.language == lang)
                for lang in languages}

    def checks(self) -> list[Check]:
        s = self.summary
        return [Check("perplexity", "probe", s.perplexity_baseline, s.perplexity_candidate,
                      higher_is_better=False, noise=abs(s.floor_perplexity_ratio - 1)),
                Check("greedy_agreement", "probe", 1.0, s.greedy_agreement,
                      higher_is_better=True, noise=1 - s.floor_agreement)]


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def score_passage(client: QualityProbeClient, baseline: Endpoint, candidate: Endpoint,
                  passage: Passage, continuation_tokens: int) -> tuple[PassageScore, str, str]:
    base = client.complete(baseline, passage.text, continuation_tokens, 0)
    cand = client.complete(candidate, passage.text, continuation_tokens, 0)
    if base.prompt_ids != cand.prompt_ids:
        raise QualityProbeError("baseline and candidate tokenize the corpus differently: they "
                                "must serve the same model")
    if not base.continuation:
        raise QualityProbeError("the baseline generated nothing (token_ids empty)")
    forced = client.complete(candidate, [*base.prompt_ids, *base.continuation], 1, 1)
    tail = forced.top1[len(base.prompt_ids) - 1:]
    hits = sum(1 for want, got in zip(base.continuation, tail) if got == want)
    floor = client.complete(candidate, [*cand.prompt_ids, *cand.continuation], 1, 1)
    own_tail = floor.top1[len(cand.prompt_ids) - 1:]
    floor_hits = sum(1 for want, got in zip(cand.continuation, own_tail) if got == want)
    score = PassageScore(
        language=passage.language, title=passage.title, tokens=len(base.logprobs),
        baseline_logprob=sum(base.logprobs), candidate_logprob=sum(cand.logprobs),
        agreement_hits=hits, agreement_total=len(base.continuation),
        free_run_match=_common_prefix(base.continuation, cand.continuation),
        baseline_text=base.text, candidate_text=cand.text,
        floor_hits=floor_hits, floor_total=len(cand.continuation),
        floor_logprob=sum(floor.logprobs[:len(cand.logprobs)]))
    return score, base.fingerprint, cand.fingerprint


Progress = Callable[[int, int, PassageScore], None]
"""``(passages done, passages in all, the last one's score)``, after each passage."""


def run_quality_probe(client: QualityProbeClient, baseline: Endpoint, candidate: Endpoint,
                      passages: Sequence[Passage], continuation_tokens: int = 32,
                      progress: Progress | None = None) -> QualityProbeResult:
    scores: list[PassageScore] = []
    prints = ("", "")
    for passage in passages:
        score, base_print, cand_print = score_passage(client, baseline, candidate, passage,
                                                      continuation_tokens)
        scores.append(score)
        prints = (base_print, cand_print)
        if progress is not None:
            progress(len(scores), len(passages), score)
    return QualityProbeResult(tuple(scores), *prints)
