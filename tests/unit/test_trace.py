"""The trace: Mooncake lines, keyed ids no prompt can be read from, bounds, rotation,
the recorder on a gateway in front of fake replicas and its admin-only download."""

from __future__ import annotations

import json
import os
import random
import stat
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
from asgi_lifespan import LifespanManager
from prometheus_client.parser import text_string_to_metric_families

from gateway.config import load_settings
from gateway.server.app import create_app
from gateway.trace.format import ID_BITS, TraceKey, TraceLine, parse_lines
from gateway.trace.writer import TraceLimits, TraceRecord, TraceWriter, load_secret
from loadtest.workloads.mooncake import parse_trace
from policies.hashing import block_hashes, chain_seed
from tests.support.api_keys import write_keys

from .fake_replica import FakeReplica

SECRET_A = b"deployment-a-secret-0123456789"
SECRET_B = b"deployment-b-secret-0123456789"
PROMPT = list(range(1000, 1320))  # 20 blocks of 16


def _hashes(salt: str | None = None) -> list[int]:
    return block_hashes(PROMPT, 16, chain_seed("m", salt))


def _record(hashes: tuple[int, ...] = (), **fields: object) -> TraceRecord:
    values: dict[str, object] = {
        "timestamp_ms": 1_700_000_000_000, "input_length": len(hashes) * 16 + 5, "output_length": 9,
        "block_hashes": hashes, "block_size": 16, "cache_salt": None, "model": "m", "replica": "r0",
        "policy": "prefix", "stream": True, "ttft_ms": 12.345, "cached_tokens": 32, "session_key": None}
    values.update(fields)
    return TraceRecord(**values)  # type: ignore[arg-type]


# -- keying ----------------------------------------------------------------------


def test_the_same_prompt_under_two_deployment_secrets_gets_unrelated_ids() -> None:
    a = TraceKey(SECRET_A).block_ids(_hashes(), None)
    b = TraceKey(SECRET_B).block_ids(_hashes(), None)
    assert len(a) == len(b) == 20
    assert not set(a) & set(b)
    # deterministic within a deployment (restarts agree), and below 2**53
    assert TraceKey(SECRET_A).block_ids(_hashes(), None) == a
    assert all(0 <= i < 2**ID_BITS for i in a + b)


def test_two_tenants_salts_give_unrelated_ids_and_no_salt_is_a_namespace_of_its_own() -> None:
    key = TraceKey(SECRET_A)
    tenant_a = key.block_ids(_hashes("salt-a"), "salt-a")
    tenant_b = key.block_ids(_hashes("salt-b"), "salt-b")
    unsalted = key.block_ids(_hashes(), None)
    assert not set(tenant_a) & set(tenant_b)
    assert not set(tenant_a) & set(unsalted)
    # even a gateway hash that happened to be equal is keyed apart by the salt
    assert key.block_ids([42], "salt-a") != key.block_ids([42], "salt-b")


def test_no_id_is_the_gateway_hash_or_the_token_ids() -> None:
    hashes = _hashes()
    ids = TraceKey(SECRET_A).block_ids(hashes, None)
    masked = {h >> (64 - ID_BITS) for h in hashes} | {h & (2**ID_BITS - 1) for h in hashes}
    assert not set(ids) & (set(hashes) | masked | set(PROMPT))
    # equal prefixes keep equal ids at the same positions (what a replay needs)
    other = block_hashes(PROMPT[:160] + [7] * 160, 16, chain_seed("m", None))
    other_ids = TraceKey(SECRET_A).block_ids(other, None)
    assert other_ids[:10] == ids[:10] and not set(other_ids[10:]) & set(ids[10:])


def test_a_line_is_a_mooncake_record_with_extra_fields_and_reads_back() -> None:
    line = TraceLine(timestamp_ms=1_700_000_000_123, input_length=325, output_length=9,
                     hash_ids=(5, 6), block_size=16, model="m", replica="r1", policy="prefix",
                     stream=True, ttft_ms=12.345, cached_tokens=32, session=77)
    text = line.encode().decode()
    assert text.endswith("\n") and text.count("\n") == 1
    item = json.loads(text)
    assert item["ttft_ms"] == 12.3
    assert "prompt" not in text and "messages" not in text
    (record,) = parse_trace([text])  # the loadtest's Mooncake reader takes it
    assert (record.input_length, record.output_length, record.hash_ids) == (325, 9, (5, 6))
    assert len(parse_lines([text, "\n"])) == 1
    (back,) = parse_lines([text])
    assert (back.block_size, back.replica, back.session, back.cached_tokens) == (16, "r1", 77, 32)
    (mooncake,) = parse_lines([('{"timestamp": 0, "input_length": 600, "output_length": 2, '
                               '"hash_ids": [1, 2]}')])
    assert mooncake.block_size == 512 and mooncake.replica is None


BAILIAN = [  # Alibaba's Bailian (Qwen) usage traces: seconds, 16 tokens an id, sessions
    {"chat_id": 159, "parent_chat_id": -1, "timestamp": 61.114, "input_length": 40,
     "output_length": 132, "type": "text", "turn": 1, "hash_ids": [7, 8]},
    {"chat_id": 160, "parent_chat_id": 159, "timestamp": 62.5, "input_length": 90,
     "output_length": 80, "type": "text", "turn": 2, "hash_ids": [7, 8, 9, 10, 11]},
]


def test_a_bailian_trace_reads_in_seconds_and_16_tokens_an_id() -> None:
    first, second = parse_lines([json.dumps(item) for item in BAILIAN])
    assert (first.timestamp_ms, second.timestamp_ms) == (61114, 62500)
    assert first.block_size == second.block_size == 16
    assert second.hash_ids == (7, 8, 9, 10, 11)
    records = parse_trace([json.dumps(item) for item in BAILIAN])  # the loadtest's reader
    assert [round(r.timestamp_ms) for r in records] == [61114, 62500]
    assert [r.block_tokens for r in records] == [16, 16]


# -- the writer: sample, bounds, rotation, drops -------------------------------------


def _writer(tmp_path: Path, **limits: object) -> TraceWriter:
    return TraceWriter(tmp_path / "trace.jsonl", TraceKey(SECRET_A),
                       TraceLimits(**limits), rng=random.Random(0))  # type: ignore[arg-type]


def _lines(writer: TraceWriter) -> list[TraceLine]:
    with writer.snapshot() as files:
        data = b"".join(handle.read(length) for handle, length in files)
    return parse_lines(data.splitlines())


def test_the_file_rotates_and_never_holds_more_than_its_bound(tmp_path: Path) -> None:
    writer = _writer(tmp_path, max_bytes=4096, keep=2)
    hashes = tuple(_hashes())
    for index in range(200):
        writer.offer(_record(hashes, timestamp_ms=index))
        writer.drain()
    files = writer._file.files()
    assert [f.name for f in files] == ["trace.jsonl.2", "trace.jsonl.1", "trace.jsonl"]
    assert all(f.stat().st_size <= 4096 for f in files)
    assert writer.disk_bytes() <= 3 * 4096
    assert writer.rotations > 2
    kept = _lines(writer)
    # the newest lines, oldest first, each whole
    stamps = [line.timestamp_ms for line in kept]
    assert stamps == sorted(stamps) and stamps[-1] == 199 and len(stamps) < 200
    assert writer.lines == 200
    assert stat.S_IMODE(os.stat(files[-1]).st_mode) == 0o600


def test_a_full_queue_drops_and_counts_never_blocks(tmp_path: Path) -> None:
    writer = _writer(tmp_path, queue=3)
    for _ in range(10):
        writer.offer(_record())
    assert writer.dropped["queue_full"] == 7
    writer.drain()
    assert writer.lines == 3


def test_sampling_keeps_or_drops_a_prefix_family_whole(tmp_path: Path) -> None:
    writer = _writer(tmp_path, sample=0.5)
    families = [block_hashes([family] * 64, 16, chain_seed("m", None)) for family in range(40)]
    for family in families:
        for turn in range(3):  # three requests per family, growing
            writer.offer(_record(tuple(family) + (turn,)))
    writer.drain()
    kept = _lines(writer)
    firsts = [line.hash_ids[0] for line in kept]
    assert 0 < len(set(firsts)) < 40
    assert all(firsts.count(first) == 3 for first in set(firsts))
    assert writer.sampled_out == 120 - len(kept)


def test_the_secret_is_made_once_and_kept_owner_only(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    first = load_secret(None, path)
    assert load_secret(None, path) == first and len(first) == 32
    assert stat.S_IMODE(os.stat(tmp_path / "t.jsonl.key").st_mode) == 0o600
    assert load_secret("configured-secret-123456", path) == b"configured-secret-123456"


# -- on a gateway ----------------------------------------------------------------------

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello " * 60}]}
ADMIN, USER = "sk-trace-admin-1", "sk-trace-user-1"


@asynccontextmanager
async def gateway(tmp_path: Path, **settings: object) -> AsyncIterator[httpx.AsyncClient]:
    replicas = [FakeReplica("a"), FakeReplica("b")]
    overrides = {"replicas": [{"id": r.name, "url": f"http://{r.name}", "model": r.model}
                              for r in replicas],
                 "health_interval": 3600.0, "policy": "prefix", **settings}
    by_id = {r.name: r for r in replicas}
    app = create_app(load_settings(overrides=overrides, env={}),
                     transport=lambda rid: by_id[rid].transport())
    async with LifespanManager(app) as manager, httpx.AsyncClient(
            transport=httpx.ASGITransport(app=manager.app), base_url="http://gw") as client:
        yield client


async def test_a_gateway_records_each_answer_and_serves_the_trace_to_admins(
        tmp_path: Path) -> None:
    keys = write_keys(tmp_path / "keys.yaml", [
        {"key": ADMIN, "tenant": "ops", "admin": True}, {"key": USER, "tenant": "team"}])
    trace = tmp_path / "trace.jsonl"
    async with gateway(tmp_path, api_keys=keys, trace={"path": str(trace)}) as client:
        user = {"authorization": f"Bearer {USER}"}
        for _ in range(3):
            assert (await client.post("/v1/chat/completions", json=CHAT,
                                      headers=user)).status_code == 200
        assert (await client.get("/admin/trace", headers=user)).status_code == 403
        download = await client.get("/admin/trace", headers={"authorization": f"Bearer {ADMIN}"})
        for _ in range(50):  # the writer thread may still be on its way
            if download.text.count("\n") == 3:
                break
            download = await client.get("/admin/trace",
                                        headers={"authorization": f"Bearer {ADMIN}"})
        metrics = (await client.get("/metrics",
                                    headers={"authorization": f"Bearer {ADMIN}"})).text
    assert download.status_code == 200
    assert download.headers["content-type"].startswith("application/x-ndjson")
    lines = parse_lines(download.text.splitlines())
    assert len(lines) == 3
    assert "hello" not in download.text
    first = lines[0]
    assert first.replica in ("a", "b") and first.policy == "prefix" and first.model == "m"
    assert first.stream is False
    assert first.input_length == 7 and first.output_length == 1 and first.cached_tokens == 4
    assert first.block_size == 32 and len(first.hash_ids) >= 2  # the gateway's own blocks
    assert lines[0].hash_ids == lines[1].hash_ids  # the same prompt, the same ids
    families = {m.name: m for m in text_string_to_metric_families(metrics)}
    assert families["prefixgate_trace_lines"].samples[0].value == 3
    assert trace.read_text().count("\n") == 3


async def test_the_trace_route_is_404_when_off_and_403_without_client_keys(
        tmp_path: Path) -> None:
    async with gateway(tmp_path) as client:
        assert (await client.get("/admin/trace")).status_code == 404
    async with gateway(tmp_path, trace={"path": str(tmp_path / "t.jsonl")}) as client:
        assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200
        refused = await client.get("/admin/trace")
    assert refused.status_code == 403
    assert "admin key" in refused.json()["error"]["message"]


async def test_two_deployments_record_the_same_prompt_with_no_text_and_no_id_in_common(
        tmp_path: Path) -> None:
    # What issue 28 promises of the file itself: no prompt text in it, and nothing that
    # joins one deployment's recording to another's.
    words = ["northwind", "tents", "warranty", "refund", "packaging", "sleeping", "bags"]
    chat = {"model": "m", "messages": [
        {"role": "system", "content": " ".join(words * 12)},
        {"role": "user", "content": "Can I still cancel my order?"}]}
    recorded: list[str] = []
    for name, secret in (("a", SECRET_A), ("b", SECRET_B)):
        path = tmp_path / name / "trace.jsonl"
        async with gateway(tmp_path, trace={"path": str(path), "secret": secret.decode()}) as client:
            for _ in range(2):
                assert (await client.post("/v1/chat/completions", json=chat)).status_code == 200
        recorded.append(path.read_text())  # the writer wrote what was queued at shutdown
    first, second = (parse_lines(text.splitlines()) for text in recorded)
    assert len(first) == len(second) == 2
    assert first[0].hash_ids == first[1].hash_ids and len(first[0].hash_ids) >= 2
    assert len(first[0].hash_ids) == len(second[0].hash_ids)
    assert not set(first[0].hash_ids) & set(second[0].hash_ids)
    for text in recorded:
        assert not any(word in text for word in [*words, "cancel", "order"])
