"""GrammarCompiler: a constraint -> a fresh llguidance matcher for one sequence.

Why llguidance: one abi3 wheel for every CPython >= 3.10 with no dependencies (no
torch of its own), masks computed on the CPU in microseconds whatever the device, JSON
schema / regex / Lark (EBNF) in one library, and a matcher with rollback, which is what
walking a sequence's drafts and back needs.

A compiled grammar is kept by its text (bounded LRU) and deep-copied for each sequence;
a compile that runs past `timeout_s` is refused (its thread is left to finish alone).
"""
from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

from tandem.errors import InvalidRequestError
from tandem.grammar.constraint import GrammarConstraint


class GrammarCompiler:
    def __init__(self, tokenizer, vocab_size: int, eos_ids: frozenset[int], cache_size: int = 64, timeout_s: float = 10.0):
        self._hf_tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_ids = sorted(eos_ids)
        self.cache_size = cache_size
        self.timeout_s = timeout_s
        self._cache: OrderedDict[str, object] = OrderedDict()
        self._lock = threading.Lock()
        self._lltok = None
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="tandem-grammar")

    @property
    def words(self) -> int:
        """int32 words of one mask row."""
        return (self.vocab_size + 31) // 32

    def matcher(self, c: GrammarConstraint):
        """A matcher at the start of c's grammar, or InvalidRequestError naming c.field."""
        grammar = self._grammar_text(c)
        with self._lock:
            compiled = self._cache.get(grammar)
            if compiled is not None:
                self._cache.move_to_end(grammar)
                return compiled.deep_copy()
        future = self._pool.submit(self._compile, grammar)
        try:
            compiled, error = future.result(timeout=self.timeout_s)
        except FutureTimeout:
            raise InvalidRequestError(c.field, f"the grammar did not compile within {self.timeout_s:g} s") from None
        if error:
            raise InvalidRequestError(c.field, _first_line(error))
        with self._lock:
            self._cache[grammar] = compiled
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return compiled.deep_copy()

    def _compile(self, grammar: str):
        import llguidance

        m = llguidance.LLMatcher(self._tokenizer(), grammar, log_level=0)
        return m, (m.get_error() if m.is_error() else "")

    def _tokenizer(self):
        with self._lock:
            if self._lltok is None:  # about half a second: built on the first constrained request
                self._lltok = _ll_tokenizer(self._hf_tokenizer, self.vocab_size, self.eos_ids)
            return self._lltok

    @staticmethod
    def _grammar_text(c: GrammarConstraint) -> str:
        from llguidance import LLMatcher, gbnf_to_lark

        try:
            if c.kind == "json":
                return LLMatcher.grammar_from_json_schema(c.value, defaults={"whitespace_flexible": False})
            if c.kind == "json_object":
                return LLMatcher.grammar_from_json_schema({"type": "object"}, defaults={"whitespace_flexible": False})
            if c.kind == "regex":
                return LLMatcher.grammar_from_regex(c.value)
            if c.kind == "choice":
                return LLMatcher.grammar_from_regex("|".join(re.escape(x) for x in json.loads(c.value)))
            text = gbnf_to_lark(c.value) if "::=" in c.value else c.value
            return LLMatcher.grammar_from_lark(text)
        except Exception as e:  # noqa: BLE001 - the library's reason goes back to the client
            raise InvalidRequestError(c.field, _first_line(str(e))) from None


def _ll_tokenizer(tokenizer, vocab_size: int, eos_ids: list[int]):
    """llguidance's view of the tokenizer: a fast Hugging Face one as it is; any other
    from each token's decoded text (tokenized back by longest match)."""
    import llguidance
    import llguidance.hf
    import transformers

    if isinstance(tokenizer, transformers.PreTrainedTokenizerFast):
        return llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size, eos_token=eos_ids)
    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(_DecodedTokens(tokenizer, vocab_size, eos_ids)),
                                  n_vocab=vocab_size, eos_token=eos_ids or None)


class _DecodedTokens:
    """A token table from tokenizer.decode([id]) (what llguidance's TokenizerWrapper reads)."""

    def __init__(self, tokenizer, vocab_size: int, eos_ids: list[int]):
        self.tokens = [tokenizer.decode([i]).encode("utf-8") for i in range(vocab_size)]
        self.eos_token_id = eos_ids[0] if eos_ids else vocab_size - 1
        self.bos_token_id = None
        self.special_token_ids = list(eos_ids)
        self._ids = {t: i for i, t in reversed(list(enumerate(self.tokens))) if t}
        self._longest = max((len(t) for t in self._ids), default=1)

    def __call__(self, text: bytes) -> list[int]:
        out, i = [], 0
        while i < len(text):
            for n in range(min(self._longest, len(text) - i), 0, -1):
                if text[i : i + n] in self._ids:
                    out.append(self._ids[text[i : i + n]])
                    i += n
                    break
            else:
                i += 1  # a byte no token spells: skipped
        return out


def _first_line(error: str) -> str:
    return error.strip().splitlines()[0] if error.strip() else "invalid grammar"
