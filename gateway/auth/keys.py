"""Client keys, tenants and per-key limits: who may call the gateway, and how much.

With ``api_keys: FILE`` (``--api-keys``) every route but ``/health`` and
``/ready`` (and ``/metrics`` when ``metrics_auth: open``) needs a client key;
without it the gateway is open, as before. The file is a YAML list::

    - key: sk-team-a-1            # or key_sha256: <64 hex digits> (sha256 of the key)
      tenant: team-a
      admin: false                # /admin/*, /dashboard (and /metrics when metrics_auth: admin)
      requests_per_minute: 600    # each omitted limit: unlimited
      tokens_per_minute: 200000
      max_concurrency: 16

How a request is admitted (:meth:`KeyStore.admit_request`, called once per HTTP
request by the gateway's front door, ``gateway.request.front``, which hands the
grant to the request's exchange and releases it after the answer's last byte):

1. The key comes from ``Authorization: Bearer KEY``, ``x-api-key: KEY`` or
   ``Authorization: Basic`` (any user name, the key as password: what a
   browser sends once it has asked, for the dashboard); spaces and tabs
   around it are taken off alike in each form, nothing else. Only the key's
   sha256 is kept in memory; the presented key's digest is looked up and
   compared with ``hmac.compare_digest``. The lookup's timing can only
   depend on the digest of what the caller sent, which says nothing of a
   valid key. Missing or unknown: 401.
2. An admin path with a key that is not ``admin``: 403.
3. ``max_concurrency``: requests of this key still being answered (a stream
   counts until its last byte); one more: 429.
4. ``requests_per_minute``: a token bucket of that many requests, refilled
   continuously (a full minute's allowance may be spent in a burst); empty: 429.
5. ``tokens_per_minute`` (generation only: chat, completions, responses;
   charged when the body has been read, :meth:`Grant.charge`): a bucket of that many tokens. The
   charge up front is an estimate, one token per 4 bytes of the request
   body plus ``max_tokens`` (or ``max_completion_tokens``; 256 when neither is
   set) times ``n`` (and times the conversations of a batch of chats); when the answer is complete it is corrected to the
   replica's ``usage`` (prompt + completion tokens); a request refused before
   any replica was tried (unknown model, no healthy replica) costs nothing.
   Without a ``usage`` otherwise (a stream without
   ``stream_options.include_usage``, a failed upstream) the estimate stands.
   A request whose estimate exceeds the whole per-minute budget is refused
   without ``Retry-After``: it can never pass.

Every 429 but the last carries ``Retry-After`` (seconds until the bucket
holds enough, or ``retry_after_seconds`` for concurrency). Counters are
each gateway instance's own (with N instances behind a balancer a key gets
up to N times its limits) unless ``redis_url`` is set: then the instances
share them through Redis, approximately (``gateway.auth.shared``).

Tenants: a request admitted with a key belongs to that key's tenant. It is
forwarded with a ``cache_salt`` derived from the tenant (:func:`tenant_salt`,
an HMAC under ``tenant_salt_secret``), so vLLM never shares KV blocks across
tenants, and the gateway's own block hashes (``policies.hashing.chain_seed``),
its memos and the linter's groups are partitioned the same way. A client's
own ``cache_salt`` is folded into its tenant's salt, never used as is: it
splits a tenant further but cannot name another tenant's salt. Without
``tenant_salt_secret`` each process draws a random secret at start-up, so
instances (and restarts) disagree on salts: set it for a fleet.

The key file is re-read when it changes (:meth:`KeyStore.watch`, a poll of
its contents every ``api_keys_reload_seconds``); a file that does not parse
keeps the last good keys and logs an error. Counters survive reloads.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hashlib
import hmac
import ipaddress
import logging
import math
import secrets
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import yaml
from prometheus_client import Counter, Gauge
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from starlette.datastructures import Headers

from gateway.errors import (
    GatewayError,
    MissingKey,
    PermissionDenied,
    RateLimited,
    Unauthenticated,
)

log = logging.getLogger("prefixgate.auth")

CLIENT_KEY_HEADERS = ("authorization", "x-api-key")
"""Where a client key comes in; never forwarded to a replica when keys are configured."""
OPEN_PATHS = frozenset({"/health", "/ready", "/openapi.json"})
ADMIN_PREFIXES = ("/admin", "/dashboard")
BYTES_PER_TOKEN = 4
DEFAULT_OUTPUT_TOKENS = 256
"""Output tokens charged up front when a request sets no ``max_tokens``."""

Access = Literal["open", "key", "admin"]


class KeyFileError(ValueError):
    """The key file cannot be read or does not validate; the message says where."""


class KeyEntry(BaseModel):
    """One entry of the key file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    key: str | None = Field(None, min_length=8)
    key_sha256: str | None = Field(None, pattern="^[0-9a-fA-F]{64}$")
    tenant: str = Field(min_length=1)
    admin: bool = False
    requests_per_minute: int | None = Field(None, gt=0)
    tokens_per_minute: int | None = Field(None, gt=0)
    max_concurrency: int | None = Field(None, gt=0)

    @field_validator("tenant")
    @classmethod
    def _printable(cls, value: str) -> str:
        if any(ord(c) < 32 for c in value):
            raise ValueError("must not contain control characters")
        return value

    @model_validator(mode="after")
    def _one_key(self) -> KeyEntry:
        if (self.key is None) == (self.key_sha256 is None):
            raise ValueError("give exactly one of key and key_sha256")
        return self

    def digest(self) -> bytes:
        if self.key is not None:
            return hashlib.sha256(self.key.encode("utf-8")).digest()
        assert self.key_sha256 is not None
        return bytes.fromhex(self.key_sha256)


@dataclass(frozen=True, slots=True)
class Limits:
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    max_concurrency: int | None = None


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a request was admitted as."""

    digest: bytes
    tenant: str
    admin: bool
    limits: Limits
    salt: str
    """The tenant's ``cache_salt``."""


Loaded = tuple[bytes, dict[bytes, Principal]]
"""A key file's sha256 and its principals by key digest."""


def tenant_salt(secret: bytes, tenant: str, client_salt: str | None = None) -> str:
    """The ``cache_salt`` forwarded for ``tenant`` (and the client's own salt, if any)."""
    message = tenant.encode("utf-8") + b"\x00"
    if client_salt is not None:
        message += b"client\x00" + client_salt.encode("utf-8", "surrogatepass")
    return "pg-" + hmac.new(secret, message, hashlib.sha256).hexdigest()[:32]


def parse_keys(text: str, secret: bytes) -> dict[bytes, Principal]:
    """The principals of a key file's text, by key digest; ``KeyFileError`` if invalid."""
    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise KeyFileError(f"not valid YAML: {exc}") from None
    if not isinstance(loaded, list):
        raise KeyFileError("must be a YAML list of key entries")
    out: dict[bytes, Principal] = {}
    for index, item in enumerate(loaded):
        try:
            entry = KeyEntry.model_validate(item)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'entry'}: "
                f"{'unknown key' if e['type'] == 'extra_forbidden' else e['msg']}"
                for e in exc.errors())
            raise KeyFileError(f"entry {index}: {problems}") from None
        digest = entry.digest()
        if digest in out:
            raise KeyFileError(f"entry {index}: the same key as an earlier entry")
        out[digest] = Principal(
            digest, entry.tenant, entry.admin,
            Limits(entry.requests_per_minute, entry.tokens_per_minute, entry.max_concurrency),
            tenant_salt(secret, entry.tenant))
    return out


class Bucket:
    """``capacity`` units, refilled at ``capacity`` per minute; may go into debt."""

    def __init__(self, capacity: int, now: float) -> None:
        self.capacity = capacity
        self.level = float(capacity)
        self.updated = now

    def _refill(self, now: float) -> None:
        self.level = min(self.capacity, self.level + (now - self.updated) * self.capacity / 60)
        self.updated = now

    def take(self, amount: float, now: float) -> float:
        """Take ``amount`` and return 0, or return the seconds until it could be taken."""
        self._refill(now)
        if self.level >= amount:
            self.level -= amount
            return 0.0
        return (amount - self.level) * 60 / self.capacity

    def give(self, amount: float, now: float) -> None:
        """Return ``amount`` (negative: take more, into debt)."""
        self._refill(now)
        self.level = min(self.capacity, self.level + amount)


@dataclass(slots=True)
class KeyUsage:
    """One key's counters; kept across reloads of the key file."""

    requests: Bucket | None = None
    tokens: Bucket | None = None
    in_flight: int = 0
    remote_in_flight: int = 0
    """This key's requests in flight on other instances (``gateway.auth.shared``)."""
    unshared_requests: float = 0.0
    unshared_tokens: float = 0.0
    """What this instance took since it last told the others (``gateway.auth.shared``)."""

    def debit(self, requests: float, tokens: float, now: float) -> None:
        """What other instances took (negative: gave back) comes off these buckets."""
        if self.requests is not None:
            self.requests.give(-requests, now)
        if self.tokens is not None:
            self.tokens.give(-tokens, now)

    def fit(self, limits: Limits, now: float) -> None:
        """Make the buckets match ``limits`` (a reload may have changed them)."""
        if limits.requests_per_minute is None:
            self.requests = None
        elif self.requests is None or self.requests.capacity != limits.requests_per_minute:
            self.requests = Bucket(limits.requests_per_minute, now)
        if limits.tokens_per_minute is None:
            self.tokens = None
        elif self.tokens is None or self.tokens.capacity != limits.tokens_per_minute:
            self.tokens = Bucket(limits.tokens_per_minute, now)


class AuthMetrics:
    """The auth series, registered into the gateway's registry (``collectors``)."""

    def __init__(self) -> None:
        self.rejections = Counter(
            "prefixgate_auth_rejections", "Requests refused by client authentication or a "
            "per-key limit, by reason.", ["reason"], registry=None)
        self.keys = Gauge("prefixgate_api_keys", "Client keys loaded from the key file.",
                          registry=None)
        self.reload_failures = Counter(
            "prefixgate_api_keys_reload_failures",
            "Key file reloads that failed (the last good keys stay).", registry=None)
        for reason in REASONS:
            self.rejections.labels(reason)

    def collectors(self) -> list[Any]:
        return [self.rejections, self.keys, self.reload_failures]


REASONS = ("missing_key", "invalid_key", "not_admin", "max_concurrency",
           "requests_per_minute", "tokens_per_minute")


SHARED_CACHES = ("Without client keys every client shares the replicas' prefix caches: one "
                 "can time its own requests to learn whether another client sent a prompt "
                 "(a timing side channel). Keys give each tenant a cache of its own "
                 "(--api-keys FILE; README, Security)")


def exposure_warning(host: str, api_keys: str | None) -> str | None:
    """The start-up warning of a gateway without keys: its clients share the prefix
    caches (always), and anyone can use it (when it listens beyond loopback)."""
    if api_keys:
        return None
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if loopback:
        return SHARED_CACHES
    return (f"!!! prefixgate listens on {host}, beyond this machine, WITHOUT client "
            "authentication: anyone who can reach it can use the replicas, read /admin/* "
            f"and /dashboard, and see /metrics. {SHARED_CACHES} !!!")


def load_store(path: str | None, secret: str | None, retry_after: int) -> KeyStore | None:
    """The key store of ``api_keys``, or None when client authentication is off."""
    return KeyStore(path, secret, retry_after) if path else None


@contextlib.asynccontextmanager
async def watching(store: KeyStore | None, interval: float) -> AsyncIterator[None]:
    """Keep ``store`` reloading its file while the block runs."""
    if store is None:
        yield
        return
    task = asyncio.ensure_future(store.watch(interval))
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _retry_after(seconds: float) -> dict[str, str]:
    return {"retry-after": str(max(1, math.ceil(seconds)))}


@dataclass(slots=True)
class Grant:
    """One admitted request: its principal, and what it holds of its key's limits."""

    principal: Principal
    usage: KeyUsage
    store: KeyStore
    charged: int = 0
    measure: Callable[[], int | None] | None = None
    released: bool = field(default=False)

    @property
    def tenant(self) -> str:
        return self.principal.tenant

    def isolate(self, data: Mapping[str, Any]) -> dict[str, Any]:
        """``data`` with the tenant's ``cache_salt`` (the client's own folded in)."""
        client = data.get("cache_salt")
        salt = (self.principal.salt if not isinstance(client, str)
                else tenant_salt(self.store.secret, self.tenant, client))
        return {**data, "cache_salt": salt}

    def charge(self, estimate: int, measure: Callable[[], int | None]) -> None:
        """Charge ``estimate`` tokens; ``measure()`` gives the real count once answered."""
        bucket = self.usage.tokens
        if bucket is None:
            return
        if estimate > bucket.capacity:
            self.store.metrics.rejections.labels("tokens_per_minute").inc()
            raise RateLimited(f"this request is estimated at {estimate} tokens, more than this "
                              f"key's limit of {bucket.capacity} tokens per minute",
                              param="max_tokens")
        wait = bucket.take(estimate, self.store.clock())
        if wait:
            self.store.metrics.rejections.labels("tokens_per_minute").inc()
            raise RateLimited(f"rate limit reached: {bucket.capacity} tokens per minute "
                              f"(this request is estimated at {estimate})",
                              headers=_retry_after(wait))
        self.charged, self.measure = estimate, measure
        self.usage.unshared_tokens += estimate

    def release(self) -> None:
        """The request is answered: free its concurrency slot, settle its tokens."""
        if self.released:
            return
        self.released = True
        self.usage.in_flight -= 1
        used = self.measure() if self.measure is not None else None
        if used is not None and self.usage.tokens is not None:
            self.usage.tokens.give(self.charged - used, self.store.clock())
            self.usage.unshared_tokens -= self.charged - used


def estimate_tokens(data: Mapping[str, Any], body_bytes: int) -> int:
    """The up-front token charge of a request (see the module docstring)."""
    output = data.get("max_completion_tokens") or data.get("max_tokens")
    choices = data.get("n")
    output = output if isinstance(output, int) and output > 0 else DEFAULT_OUTPUT_TOKENS
    choices = choices if isinstance(choices, int) and choices > 0 else 1
    batch = data.get("messages")
    if isinstance(batch, list) and batch and isinstance(batch[0], list):
        choices *= len(batch)  # a batch of chats: each conversation its own answer
    return math.ceil(body_bytes / BYTES_PER_TOKEN) + output * choices


class KeyStore:
    """The loaded keys, their counters, and the watcher that reloads the file."""

    def __init__(self, path: str, secret: str | None = None,
                 retry_after: int = 1, clock: Callable[[], float] = time.monotonic,
                 metrics: AuthMetrics | None = None) -> None:
        self.path = path
        self.secret = secret.encode("utf-8") if secret else secrets.token_bytes(32)
        self.retry_after = retry_after
        self.clock = clock
        self.metrics = metrics or AuthMetrics()
        self._usage: dict[bytes, KeyUsage] = {}
        self._failed: str | None = None
        self._digest = b""
        self._keys: dict[bytes, Principal] = {}
        loaded = self._load()
        if isinstance(loaded, KeyFileError):
            raise KeyFileError(f"api keys {path}: {loaded}")
        assert loaded is not None
        self._digest, self._keys = loaded
        self.metrics.keys.set(len(self._keys))

    def _read(self) -> str:
        try:
            with open(self.path, encoding="utf-8") as handle:
                return handle.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise KeyFileError(f"cannot read key file {self.path}: {exc}") from None

    # -- reloading --------------------------------------------------------------------

    def _load(self) -> Loaded | KeyFileError | None:
        """The file's digest and keys when its text changed, None when it did not, or
        what is wrong with it. Touches no shared state: it runs in a worker thread."""
        try:
            text = self._read()
            digest = hashlib.sha256(text.encode("utf-8")).digest()
            if digest == self._digest:
                return None
            return digest, parse_keys(text, self.secret)
        except KeyFileError as exc:
            return exc

    def _apply(self, loaded: Loaded | KeyFileError | None) -> bool:
        if isinstance(loaded, KeyFileError):
            if self._failed != str(loaded):  # once per distinct problem, not every poll
                log.error("api keys %s: %s; keeping the %d keys loaded before",
                          self.path, loaded, len(self._keys))
                self.metrics.reload_failures.inc()
            self._failed = str(loaded)
            return False
        self._failed = None
        if loaded is None:
            return False
        self._digest, self._keys = loaded
        for gone in set(self._usage) - set(self._keys):
            if self._usage[gone].in_flight == 0:
                del self._usage[gone]
        self.metrics.keys.set(len(self._keys))
        log.info("api keys %s: reloaded, %d keys", self.path, len(self._keys))
        return True

    def reload(self) -> bool:
        """Re-read the file; True when new keys were taken. A bad file keeps the old ones."""
        return self._apply(self._load())

    async def watch(self, interval: float) -> None:
        """Reload the file every ``interval`` seconds when it changed (until cancelled);
        reading and parsing run in a worker thread, only the swap on the loop."""
        while True:
            await asyncio.sleep(interval)
            self._apply(await asyncio.to_thread(self._load))

    # -- admission ----------------------------------------------------------------------

    def authenticate(self, presented: str | None) -> Principal:
        if not presented:
            self.metrics.rejections.labels("missing_key").inc()
            raise MissingKey("You didn't provide an API key: send it as "
                             "'Authorization: Bearer KEY' or 'x-api-key: KEY'.")
        digest = hashlib.sha256(presented.encode("utf-8", "surrogatepass")).digest()
        principal = self._keys.get(digest)
        if principal is None or not hmac.compare_digest(principal.digest, digest):
            self.metrics.rejections.labels("invalid_key").inc()
            raise Unauthenticated("Incorrect API key provided.")
        return principal

    def usages(self) -> list[tuple[Principal, KeyUsage]]:
        """Each loaded key this instance has admitted requests for, with its counters."""
        return [(self._keys[digest], usage) for digest, usage in self._usage.items()
                if digest in self._keys]

    def admit(self, principal: Principal) -> Grant:
        """Take a concurrency slot and a request from ``principal``'s limits, or raise 429."""
        now = self.clock()
        usage = self._usage.setdefault(principal.digest, KeyUsage())
        usage.fit(principal.limits, now)
        limit = principal.limits.max_concurrency
        if limit is not None and usage.in_flight + usage.remote_in_flight >= limit:
            self.metrics.rejections.labels("max_concurrency").inc()
            raise RateLimited(f"rate limit reached: {limit} concurrent requests for this key",
                              headers=_retry_after(self.retry_after))
        if usage.requests is not None:
            wait = usage.requests.take(1, now)
            if wait:
                self.metrics.rejections.labels("requests_per_minute").inc()
                raise RateLimited(f"rate limit reached: {usage.requests.capacity} requests "
                                  "per minute", headers=_retry_after(wait))
            usage.unshared_requests += 1
        usage.in_flight += 1
        return Grant(principal, usage, self)

    def admit_request(self, path: str, headers: Headers,
                      metrics_auth: Access = "open") -> Grant | None:
        """Admit one HTTP request (module docstring): None on an open path, else the
        grant it holds until its answer's last byte (``Grant.release``); raises the
        401, 403 or 429 to answer (an admin path's 401 asks for Basic credentials)."""
        needs = scope_of(path, metrics_auth)
        if needs == "open":
            return None
        try:
            principal = self.authenticate(presented_key(headers))
            if needs == "admin" and not principal.admin:
                self.metrics.rejections.labels("not_admin").inc()
                raise PermissionDenied("this route needs an admin key")
            return self.admit(principal)
        except GatewayError as exc:
            if needs == "admin" and exc.status == 401:
                exc.headers["www-authenticate"] = 'Basic realm="prefixgate admin"'
            raise


HTTP_WHITESPACE = " \t"
"""What surrounds a key in any header and is not part of it (RFC 9110's OWS). Nothing
else is stripped, in any form: U+0085 or U+00A0 after a key make another string."""


def presented_key(headers: Headers) -> str | None:
    """The client key of a request, from any of the headers it may come in, with
    ``HTTP_WHITESPACE`` around it taken off the same way in each."""
    authorization = headers.get("authorization", "").strip(HTTP_WHITESPACE)
    scheme, _, credentials = authorization.partition(" ")
    credentials = credentials.strip(HTTP_WHITESPACE)
    if scheme.lower() == "bearer" and credentials:
        return credentials
    if scheme.lower() == "basic" and credentials:
        with contextlib.suppress(binascii.Error, UnicodeDecodeError):
            decoded = base64.b64decode(credentials, validate=True).decode("utf-8")
            return decoded.partition(":")[2] or None
    return headers.get("x-api-key", "").strip(HTTP_WHITESPACE) or None


def scope_of(path: str, metrics_auth: Access) -> Access:
    """What a path needs: nothing, any key, or an admin key."""
    if path in OPEN_PATHS:
        return "open"
    if path == "/metrics":
        return metrics_auth
    if any(path == p or path.startswith(p + "/") for p in ADMIN_PREFIXES):
        return "admin"
    return "key"
