"""Property: the blocks a decision sees are the blocks of a full render and tokenize.

For random streams of requests of every shape the gateway routes — chats of
several messages, one user message that grows, a shared document with
varying questions in one message, agent loops ending on tool messages,
completions with text or token ids, with and without ``cache_salt`` —
``PromptHasher.describe`` (the gateway's path: memoized pieces, incremental
rendering, the chain memo) must give exactly the block hashes and token
count of rendering and tokenizing each whole prompt from scratch, and so the
same matched blocks per replica in any index. The stream shares text on
purpose (fragments drawn from a small pool), so memos are hit and missed in
every order.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.tokenizer import ByteRenderer, HFRenderer, Renderer
from gateway.prompt.render import PromptHasher
from policies.hashing import block_hashes, chain_seed
from policies.prefix_index import ApproximatePrefixIndex

BLOCK = 16
FRAGMENTS = ["The harbour master counted the boats. ", "退款须在三十天内申请。", "  spaced   out\n",
             "Section 4: shipping is not refunded.\n", "naïve café ", "x" * 40, "1234567890 ",
             "\t", "ok", "東京の天気は晴れ。", "😀 emoji ", "\r\n"]
TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "find",
                                           "parameters": {"type": "object", "properties": {}}}}]

text = st.lists(st.sampled_from(FRAGMENTS), min_size=1, max_size=12).map("".join)
salt = st.sampled_from([None, None, "tenant-a", "tenant-b"])


@st.composite
def requests(draw: st.DrawFn) -> list[tuple[str, dict[str, Any]]]:
    """(kind, body) of requests in one of the shapes above: one, or a message growing."""
    shape = draw(st.sampled_from(["chat", "grow", "document", "agent", "text", "ids"]))
    body: dict[str, Any]
    if shape == "chat":
        turns = draw(st.lists(text, min_size=1, max_size=5))
        messages: list[dict[str, Any]] = [{"role": "system", "content": draw(text)}]
        messages += [{"role": ("user", "assistant")[i % 2], "content": t}
                     for i, t in enumerate(turns)]
        if messages[-1]["role"] == "assistant":
            messages.append({"role": "user", "content": draw(text)})
        body = {"messages": messages}
    elif shape == "grow":  # the same user message, longer on every request
        parts = draw(st.lists(text, min_size=1, max_size=6))
        grown = [{"messages": [{"role": "user", "content": "".join(parts[:n])}]}
                 for n in range(1, len(parts) + 1)]
        return [("chat", body) for body in grown]
    elif shape == "document":
        body = {"messages": [{"role": "user", "content": FRAGMENTS[0] * 6 + FRAGMENTS[3] * 4
                              + "Question: " + draw(text)}]}
    elif shape == "agent":
        calls = draw(st.integers(1, 3))
        messages = [{"role": "system", "content": FRAGMENTS[0] * 5},
                    {"role": "user", "content": draw(text)}]
        for n in range(calls):
            messages.append({"role": "assistant", "content": "", "tool_calls": [{
                "id": f"c{n}", "type": "function",
                "function": {"name": "lookup", "arguments": f'{{"q": {n}}}'}}]})
            messages.append({"role": "tool", "tool_call_id": f"c{n}", "content": draw(text)})
        body = {"messages": messages, "tools": TOOLS}
    elif shape == "text":
        body = {"prompt": FRAGMENTS[0] * 4 + draw(text)}
    else:
        body = {"prompt": draw(st.lists(st.integers(0, 150_000), min_size=0, max_size=80))}
    chosen = draw(salt)
    if chosen is not None:
        body["cache_salt"] = chosen
    return [("chat" if "messages" in body else "completions", body)]


def reference(renderer: Renderer, kind: str, body: dict[str, Any]) -> tuple[list[int], int]:
    """Render and tokenize the whole prompt from scratch; hash its full blocks."""
    seed = chain_seed("m", body.get("cache_salt"))
    if kind == "chat":
        ids = renderer.text_token_ids(renderer.render_chat(body), add_special_tokens=False)
    elif isinstance(body["prompt"], list):
        ids = body["prompt"]
        return block_hashes(ids, BLOCK, seed), len(ids)
    else:
        ids = renderer.text_token_ids(body["prompt"], add_special_tokens=True)
    units = renderer.units_per_token
    return block_hashes(ids, BLOCK * units, seed), -(-len(ids) // units)


def check_stream(renderer: Renderer, groups: list[list[tuple[str, dict[str, Any]]]]) -> None:
    stream = [request for group in groups for request in group]
    # Small reuse steps, so that the prompts of a short stream exercise piece reuse.
    hasher = PromptHasher(renderer, reuse_step=16, reuse_min_chars=48)
    index = ApproximatePrefixIndex(ttl_seconds=1e9, default_capacity_blocks=1 << 20)
    for step, (kind, body) in enumerate(stream):
        routed = hasher.describe("m", body, kind, BLOCK)
        hashes, tokens = reference(renderer, kind, body)
        assert list(routed.block_hashes) == hashes
        assert routed.prompt_tokens == tokens
        assert index.match(routed.block_hashes, 0.0) == index.match(tuple(hashes), 0.0)
        index.record(f"r{step % 3}", routed.block_hashes, 0.0)
        hasher.run_pending()  # learning and audits, as the gateway runs them between requests
    assert hasher.reuse_audit_failures == 0
    memo = hasher.conversations
    assert memo is None or memo.audit_failures == 0


Stream = list[list[tuple[str, dict[str, Any]]]]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(requests(), min_size=1, max_size=10))
def test_decision_blocks_equal_a_full_render_with_the_real_tokenizer(
        qwen: HFRenderer, stream: Stream) -> None:
    check_stream(qwen, stream)


@settings(max_examples=200, deadline=None)
@given(st.lists(requests(), min_size=1, max_size=10))
def test_decision_blocks_equal_a_full_render_in_byte_mode(stream: Stream) -> None:
    check_stream(ByteRenderer(), stream)
