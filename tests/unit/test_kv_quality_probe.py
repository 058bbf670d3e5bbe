"""The quality probe's corpus, its reading of vLLM answers and its arithmetic, on fake endpoints."""

from __future__ import annotations

import json
import math

import httpx
import pytest

from gateway.kv.gate import GateRule, decide
from gateway.kv.quality_probe import (
    Endpoint,
    QualityProbeClient,
    QualityProbeError,
    load_corpus,
    parse_choice,
    run_quality_probe,
)

# Trimmed from a real vLLM 0.32 answer (SmolLM2, prompt_logprobs=0, return_token_ids).
VLLM_ANSWER = {
    "choices": [{
        "index": 0, "text": "\n\nIn this", "token_ids": [198, 198, 788, 451],
        "prompt_token_ids": [504, 2365, 6354],
        "prompt_logprobs": [None,
                            {"2365": {"logprob": -14.458, "rank": 13723,
                                      "decoded_token": " quick"}},
                            {"6354": {"logprob": -6.25, "rank": 52, "decoded_token": " brown"},
                             "314": {"logprob": -1.5, "rank": 1, "decoded_token": " is"}}]}],
    "system_fingerprint": "vllm-0.32.0-0cc771c3",
}


def test_the_shipped_corpus_has_several_languages_chinese_included() -> None:
    passages = load_corpus()
    languages = {p.language for p in passages}
    assert {"en", "zh"} <= languages and len(languages) >= 5
    for language in languages:
        own = [p for p in passages if p.language == language]
        assert len(own) >= 3 and all(len(p.text.encode()) > 300 for p in own), language
    assert any("图书馆" in p.text for p in passages)
    assert len(load_corpus(per_language=1)) == len(languages)


def test_reads_vllm_prompt_logprobs() -> None:
    scored = parse_choice(VLLM_ANSWER)
    assert scored.prompt_ids == (504, 2365, 6354)
    assert scored.logprobs == (-14.458, -6.25)
    assert scored.top1 == (None, 314)
    assert scored.continuation == (198, 198, 788, 451)


def test_an_endpoint_without_prompt_logprobs_is_named() -> None:
    with pytest.raises(QualityProbeError, match="must be vLLM"):
        parse_choice({"choices": [{"text": "hi"}]})


class FakeVllm:
    """Tokens are characters; every prompt token has log-prob ``logprob``; greedy output 1 2 3 4.

    Teacher-forced, the top-1 token is the baseline's continuation token except at
    the positions in ``flip``.
    """

    def __init__(self, logprob: float, flip: frozenset[int] = frozenset(),
                 shift_tokens: bool = False) -> None:
        self.logprob, self.flip, self.shift = logprob, flip, shift_tokens

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        prompt = body["prompt"]
        ids = [ord(c) + (1 if self.shift else 0) for c in prompt] if isinstance(prompt, str) \
            else list(prompt)
        entries: list[dict | None] = [None]
        text_len = len(ids) - 4 if not isinstance(prompt, str) else len(ids)
        for position, token in enumerate(ids[1:], start=1):
            entry = {str(token): {"logprob": self.logprob, "rank": 1}}
            k = position - text_len
            if body["prompt_logprobs"] and 0 <= k and k in self.flip:
                entry = {str(token): {"logprob": self.logprob, "rank": 2},
                         "9999": {"logprob": -0.1, "rank": 1}}
            entries.append(entry)
        return httpx.Response(200, json={
            "choices": [{"index": 0, "text": "abcd", "token_ids": [1, 2, 3, 4],
                         "prompt_token_ids": ids, "prompt_logprobs": entries}],
            "system_fingerprint": f"fake-{self.logprob}"})


def transport(baseline: FakeVllm, candidate: FakeVllm) -> httpx.MockTransport:
    def handle(request: httpx.Request) -> httpx.Response:
        return (baseline if request.url.host == "base" else candidate)(request)
    return httpx.MockTransport(handle)


def test_mean_logprob_difference_perplexity_ratio_and_agreement() -> None:
    passages = load_corpus(per_language=1)
    client = QualityProbeClient(transport=transport(FakeVllm(-2.0), FakeVllm(-2.1, frozenset({1}))))
    result = run_quality_probe(client, Endpoint("http://base", "m"),
                               Endpoint("http://cand/v1", "m"), passages, continuation_tokens=4)
    s = result.summary
    assert s.tokens == sum(len(p.text) - 1 for p in passages)
    assert s.mean_logprob_diff == pytest.approx(-0.1)
    assert s.perplexity_ratio == pytest.approx(math.exp(0.1))
    assert s.greedy_agreement == pytest.approx(3 / 4)  # one of four positions flipped
    assert s.free_run_agreement == 1.0  # both generated 1 2 3 4
    assert not result.emulation
    checks = {c.name: c.relative_drop for c in result.checks()}
    assert checks == pytest.approx({"perplexity": math.exp(0.1) - 1, "greedy_agreement": 0.25})


def test_endpoints_that_tokenize_differently_are_refused() -> None:
    client = QualityProbeClient(
        transport=transport(FakeVllm(-2.0), FakeVllm(-2.0, shift_tokens=True)))
    with pytest.raises(QualityProbeError, match="same model"):
        run_quality_probe(client, Endpoint("http://base", "m"), Endpoint("http://cand", "m"),
                          load_corpus(per_language=1), continuation_tokens=4)


def test_an_emulation_fingerprint_marks_the_result() -> None:
    class Emulated(FakeVllm):
        def __call__(self, request: httpx.Request) -> httpx.Response:
            answer = super().__call__(request)
            body = answer.json()
            body["system_fingerprint"] = "prefixgate-kv-emulation:fp8"
            return httpx.Response(200, json=body)

    client = QualityProbeClient(transport=transport(FakeVllm(-2.0), Emulated(-2.0)))
    result = run_quality_probe(client, Endpoint("http://base", "m"), Endpoint("http://cand", "m"),
                               load_corpus(per_language=1)[:1], continuation_tokens=4)
    assert result.emulation


def test_an_endpoint_against_itself_drops_only_its_noise_floor() -> None:
    # A replica whose teacher-forced scoring disagrees with its own decoding on one
    # token in four (prefill and decode kernels differ): judged against itself, the
    # raw agreement is 75%, and all of it is noise.
    noisy = FakeVllm(-2.0, frozenset({2}))
    client = QualityProbeClient(transport=transport(noisy, noisy))
    seen: list[tuple[int, int]] = []
    passages = load_corpus(per_language=1)
    result = run_quality_probe(client, Endpoint("http://base", "m"), Endpoint("http://cand", "m"),
                               passages, continuation_tokens=4,
                               progress=lambda done, total, score: seen.append((done, total)))
    assert seen == [(i, len(passages)) for i in range(1, len(passages) + 1)]
    s = result.summary
    assert s.greedy_agreement == pytest.approx(3 / 4) and s.floor_agreement == pytest.approx(3 / 4)
    assert s.floor_perplexity_ratio == pytest.approx(1.0)
    checks = {c.name: c for c in result.checks()}
    assert checks["greedy_agreement"].relative_drop == pytest.approx(0.25)
    assert checks["greedy_agreement"].noise == pytest.approx(0.25)
    assert checks["greedy_agreement"].beyond_noise == pytest.approx(0.0)
    verdict = decide(result.checks(), GateRule(), "auto")
    assert verdict.passed  # the raw 25% drop would have failed the 10% limit
