"""Text of a sequence's output, and where a stop string cuts it."""
from __future__ import annotations

_PARTIAL = "\ufffd"  # what a UTF-8 character cut between tokens decodes as until it is whole


class Detokenizer:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._backend = _backend_decode(tokenizer)
        self._tokens: dict[int, str] = {}  # token id -> its text alone (logprobs name many, often)

    def token_text(self, token_id: int) -> str:
        """One token's text alone, special tokens included (what a logprob names)."""
        text = self._tokens.get(token_id)
        if text is None:
            if self._backend is not None:
                text = self._backend([token_id], skip_special_tokens=False)
            else:
                text = self.tokenizer.decode([token_id], skip_special_tokens=False, clean_up_tokenization_spaces=False)
            self._tokens[token_id] = text
        return text

    def text(self, token_ids: list[int]) -> str:
        # No clean-up of spaces: it rewrites text across token boundaries (" ." -> "."),
        # and then text decoded a window at a time would not join into the whole.
        if self._backend is not None:
            return self._backend(token_ids, skip_special_tokens=True)
        return self.tokenizer.decode(token_ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)


def _backend_decode(tokenizer):
    """The tokenizers library's decode, where the tokenizer's own decode only wraps it (and,
    with no clean-up, adds nothing): two calls a sequence a tick, the wrapper's argument
    conversions cost more than the decode."""
    try:
        from tokenizers import Tokenizer
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:
        return None
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if isinstance(tokenizer, TokenizersBackend) and type(tokenizer)._decode is TokenizersBackend._decode \
            and isinstance(backend, Tokenizer):
        return backend.decode
    return None


class IncrementalText:
    """One sequence's output text, decoded a few tokens at a time.

    Decoding the whole output at every tick costs O(output) per sequence per tick
    (0.7 ms for 4k tokens, per sequence, on this project's CPU). Instead each update
    decodes only a window: the tokens since the last point where the text was whole,
    after the tokens just before it (so a SentencePiece word keeps its leading space),
    and keeps what the window adds. The pieces join into what decoding the whole output
    at once gives (tested on the real tokenizer). Output tokens are only ever appended.
    """

    def __init__(self):
        self.text = ""  # the text of tokens[:read], whole characters only
        self.prefix = 0  # the window's context starts here ...
        self.read = 0  # ... and its new tokens here

    def _tail(self, detok: Detokenizer, tokens: list[int]) -> str:
        before = detok.text(tokens[self.prefix : self.read])
        after = detok.text(tokens[self.prefix :])
        return after[len(before) :]

    def stable(self, detok: Detokenizer, tokens: list[int]) -> str:
        """The text so far without a trailing partial character."""
        if len(tokens) < self.read:  # a point before what is decoded: decode it whole, change nothing
            return detok.text(tokens).rstrip(_PARTIAL)
        if self.read == len(tokens):
            return self.text
        tail = self._tail(detok, tokens)
        if tail.endswith(_PARTIAL):  # wait for the character's last byte
            return self.text + tail.rstrip(_PARTIAL)
        self.text += tail
        self.prefix, self.read = self.read, len(tokens)
        return self.text

    def whole(self, detok: Detokenizer, tokens: list[int]) -> str:
        """The text so far, a trailing partial character included (as a final output has it)."""
        if len(tokens) < self.read:
            return detok.text(tokens)
        text = self.stable(detok, tokens)
        return text if self.read == len(tokens) else self.text + self._tail(detok, tokens)


def find_stop(text: str, stops: tuple[str, ...], search_from: int) -> int | None:
    """The index where the earliest stop string starting at or after search_from begins."""
    hits = [i for s in stops if (i := text.find(s, max(0, search_from))) >= 0]
    return min(hits) if hits else None
