"""IncrementalText: the output text decoded a window at a time joins into the whole decode."""
from __future__ import annotations

import random

import pytest

from tandem.detokenizer import Detokenizer, IncrementalText


@pytest.fixture(scope="module")
def detok(default_model):
    return Detokenizer(default_model.tokenizer)


def _grow(detok, tokens: list[int], rng: random.Random) -> tuple[list[str], str]:
    """Append tokens in random chunks (1-5, as verify rounds emit them), reading the stable
    text after each; returns the stable texts seen and the final whole text."""
    inc, out, seen = IncrementalText(), [], []
    i = 0
    while i < len(tokens):
        n = rng.randint(1, 5)
        out.extend(tokens[i : i + n])
        i += n
        seen.append(inc.stable(detok, out))
    return seen, inc.whole(detok, out)


def test_real_text_joins_into_the_whole_decode(detok, default_model):
    text = ("The café served crème brûlée — 3½ portions, naïve “quotes”, 日本語のテキスト, emoji 🙂🚀, "
            "and code: def f(x):\n    return x ** 2  # done.\n\n  Tabs\tand  double  spaces .")
    tokens = default_model.tokenizer(text, add_special_tokens=False)["input_ids"]
    rng = random.Random(0)
    for _ in range(5):
        seen, whole = _grow(detok, tokens, rng)
        assert whole == detok.text(tokens) == text
        for stable in seen:  # every stable text is a prefix of the whole, without a partial character
            assert whole.startswith(stable) and not stable.endswith("\ufffd")


def test_random_tokens_byte_pieces_and_specials_included(detok, default_model):
    """Any token ids, even ones that cut characters into invalid UTF-8, and special tokens
    (which decode to nothing): the joined text equals the whole decode."""
    vocab = len(default_model.tokenizer)
    rng = random.Random(1)
    byte_like = [i for i in range(min(vocab, 512))]  # the byte-level pieces live low in the vocabulary
    for trial in range(40):
        pool = byte_like if trial % 2 else range(vocab)
        tokens = [rng.choice(pool) for _ in range(rng.randint(1, 60))]
        _, whole = _grow(detok, tokens, rng)
        assert whole == detok.text(tokens), tokens


def test_stable_text_holds_back_a_cut_character_until_it_is_whole(detok, default_model):
    tokens = default_model.tokenizer("ok 🦩", add_special_tokens=False)["input_ids"]
    # this emoji takes three byte-level tokens; cut inside it
    cuts = [n for n in range(1, len(tokens)) if detok.text(tokens[:n]).endswith("\ufffd")]
    assert cuts, "the emoji should span more than one token"
    inc = IncrementalText()
    assert inc.stable(detok, tokens[: cuts[0]]) == detok.text(tokens[: cuts[0]]).rstrip("\ufffd")
    assert inc.whole(detok, tokens[: cuts[0]]).endswith("\ufffd")
    assert inc.stable(detok, tokens) == "ok 🦩"


def test_the_backend_decode_is_the_tokenizers_own_without_clean_up(detok, default_model):
    """The default model's tokenizer is decoded through the tokenizers library directly
    (skipping transformers' wrapper): same text as the wrapper's, specials dropped."""
    tok = default_model.tokenizer
    assert detok._backend is not None
    rng = random.Random(2)
    specials = list(tok.all_special_ids)
    for _ in range(200):
        ids = [rng.randrange(len(tok)) for _ in range(rng.randint(0, 40))] + rng.sample(specials, min(2, len(specials)))
        rng.shuffle(ids)
        assert detok.text(ids) == tok.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)


def test_a_point_before_what_is_decoded_is_decoded_whole_and_changes_nothing(detok, default_model):
    tokens = default_model.tokenizer("ok 🦩 and more text after it", add_special_tokens=False)["input_ids"]
    inc = IncrementalText()
    full = inc.stable(detok, tokens)
    for n in range(len(tokens)):
        assert inc.stable(detok, tokens[:n]) == detok.text(tokens[:n]).rstrip("\ufffd")
        assert inc.whole(detok, tokens[:n]) == detok.text(tokens[:n])
    assert inc.stable(detok, tokens) == full == detok.text(tokens)
