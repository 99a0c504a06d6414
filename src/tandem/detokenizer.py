"""Text of a sequence's output, and where a stop string cuts it."""
from __future__ import annotations


class Detokenizer:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def text(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    def stable_text(self, token_ids: list[int]) -> str:
        """The text so far minus a trailing partial character (a UTF-8 sequence cut
        between tokens decodes as U+FFFD until its last byte arrives)."""
        return self.text(token_ids).rstrip("\ufffd")


def find_stop(text: str, stops: tuple[str, ...], search_from: int) -> int | None:
    """The index where the earliest stop string starting at or after search_from begins."""
    hits = [i for s in stops if (i := text.find(s, max(0, search_from))) >= 0]
    return min(hits) if hits else None
