"""The concrete fix for each kind of finding, in words (never prompt text)."""

from __future__ import annotations

MOVE = "move it to the last user message, after the shared prefix"

SUGGESTIONS: dict[str, str] = {
    "timestamp": f"The current time changes on every request: {MOVE}, or drop it; if the "
                 "model only needs the day, round it to the day.",
    "date": f"A date that follows the calendar changes the prefix every day: {MOVE}; if it is "
            "fixed text (a policy's effective date), it costs nothing.",
    "time": f"A clock time changes on every request: {MOVE}, or drop it.",
    "weekday": f"The weekday changes every day: {MOVE}.",
    "epoch": f"A Unix timestamp changes on every request: {MOVE}, or drop it.",
    "uuid": "A unique id in the prompt makes every prefix unique: drop it (send it as a header "
            f"or in `user`/metadata), or {MOVE}.",
    "ulid": "A ULID is unique per request: drop it (send it as a header or metadata), "
            f"or {MOVE}.",
    "request_id": "A request id is unique per request: drop it from the prompt (send it as "
                  "the x-request-id header).",
    "session_id": f"A session id differs between sessions: drop it, or {MOVE}.",
    "record_id": "An order, account or ticket number belongs to one user or one "
                 f"conversation: {MOVE}, so that all of them share the cached prefix.",
    "jwt": "A token (JWT) in the prompt is unique and a secret: drop it.",
    "email": f"Per-user detail: {MOVE}, so that all users share the cached prefix.",
    "ip": f"Per-client detail: drop it, or {MOVE}.",
    "phone": f"Per-user detail: {MOVE}, so that all users share the cached prefix.",
    "name": f"Per-user detail: {MOVE}, so that all users share the cached prefix.",
    "nonce": "A random string is unique per request: drop it from the prompt.",
    "counter": f"A counter changes on every request: drop it, or {MOVE}.",
    "text": f"This span differs between requests of the same app: {MOVE}.",
    "document": "A passage that differs per request (retrieved documents, search results, "
                "a user's record) sits inside the shared prefix, so everything after it is "
                f"recomputed on every request: put the fixed instructions first and {MOVE}.",
    "category": f"This span takes a few values (a tier, a plan, a region): {MOVE}, or keep "
                "one prefix per value.",
    "unstable_json": "Serialize tools the same way every time: fixed key order "
                     "(json.dumps(..., sort_keys=True)), each tool once.",
    "tool_order": "Send the tools in a fixed order (for example sorted by name).",
    "cache_salt": "A cache_salt unique per request disables prefix caching for that request: "
                  "use one salt per tenant, or none.",
    "template_dynamic": "The chat template writes the current date into the prompt: pin it "
                        "(for Llama 3.x pass chat_template_kwargs {\"date_string\": "
                        "\"26 Jul 2024\"}), or use a template without strftime_now.",
    "moved_to_front": "vLLM renders this model's developer messages, and once there is one "
                      "every system message, inside one system prompt at the front: the "
                      "request that adds one recomputes the whole conversation after where "
                      "its text lands. Put fixed instructions in the first message; send "
                      "what changes during a conversation in a user message.",
    "media": "vLLM turns this part (an image, audio, a video, a file) into tokens of its "
             "own: the linter leaves it out, so token positions after it are lower than "
             "vLLM's. The same media in the same place is cached like text; a different one "
             "in each request ends the reusable prefix where it is.",
    "short_prefix": "The shared prefix is shorter than one KV block, so nothing of it can be "
                    "cached: put the stable instructions first and make them at least a block "
                    "long, or expect no prefix-cache benefit.",
}

UNICODE: dict[str, str] = {
    "bom": "Strip the byte-order mark (read files with encoding='utf-8-sig').",
    "zero_width": "Remove zero-width characters: invisible, but they change the tokens.",
    "nbsp": "Replace no-break spaces with plain spaces so every copy tokenizes the same.",
    "crlf": "Use LF line endings everywhere: CRLF and LF tokenize differently.",
    "trailing_space": "Strip trailing spaces: editors and pipelines drop them unpredictably.",
    "not_nfc": "Normalize to NFC (unicodedata.normalize('NFC', text)) before sending.",
    "varies": "Requests differ only in invisible characters (Unicode form, spaces, line "
              "endings): normalize the text once, before it is sent.",
}

FINAL = "In the final user turn: new on every request anyway, so it costs no cache."


def suggestion(kind: str, region: str, problem: str = "") -> str:
    if kind == "unicode":
        return UNICODE.get(problem, UNICODE["varies"])
    if region == "final" and kind not in ("cache_salt", "template_dynamic"):
        return FINAL
    return SUGGESTIONS.get(kind, SUGGESTIONS["text"])
