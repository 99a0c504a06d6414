"""Keys of a request's prompt prefix that the router and the engine replica both compute
from the same Request, without a tokenizer: chained hashes of the prompt's text in
whole chunks of CHUNK_CHARS characters (a chat's messages as one text of roles and
contents). Two prompts share key i exactly when their first i chunks are equal, so the
longest key a replica holds says how much of a new prompt's prefix it has cached."""
from __future__ import annotations

import hashlib

CHUNK_CHARS = 256  # about 64 tokens of English: 4 KV blocks of 16
MAX_CHUNKS = 64  # keys of the first 16 K characters; beyond that a prefix is long enough to route on


def routing_text(prompt, messages) -> str:
    """The text a request's prefix keys are taken from."""
    if messages is not None:
        try:
            return "".join(f"{m.get('role')}\x1f{m.get('content')}\x1e" for m in messages)
        except AttributeError:
            return ""  # not a list of dicts: the engine refuses it
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):
        return ",".join(map(str, prompt)) + ","
    return ""


def prefix_keys(prompt, messages=None) -> list[int]:
    """One key per whole chunk of the request's routing text, in order, each hashing
    everything before it too."""
    text = routing_text(prompt, messages)
    keys: list[int] = []
    h = hashlib.blake2b(digest_size=8)
    for i in range(min(len(text) // CHUNK_CHARS, MAX_CHUNKS)):
        h.update(text[i * CHUNK_CHARS:(i + 1) * CHUNK_CHARS].encode("utf-8", "surrogatepass"))
        keys.append(int.from_bytes(h.copy().digest(), "little"))
    return keys
