"""The DFlash evaluation set (bench/dflash_eval_prompts.py) stays apart from every training
source of scripts/train_dflash.py: the template and extra prompts (at the counts and seeds
of the runs behind the shipped weights), the general prompts, and the installed packages'
text that the raw completions and passages are cut from. Exact and near duplicates
(dflash_general_prompts.Overlap: equal up to case and punctuation, or half of an eval
prompt's word 5-grams found in a training prompt) both count."""
from __future__ import annotations

import os
import sys
from collections import Counter

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "scripts"))
sys.path.insert(0, os.path.join(ROOT, "bench"))

from dflash_eval_prompts import KINDS, eval_prompts  # noqa: E402
from dflash_general_prompts import Overlap, general_prompts  # noqa: E402
from dflash_sources import _text, passages, raw_excerpts, source_files  # noqa: E402
from dflash_prompts import bench_prompts, make_extra_prompts, make_prompts  # noqa: E402

EVAL = eval_prompts()
TEXTS = [e["prompt"] for e in EVAL]


@pytest.fixture(scope="module")
def overlap():
    return Overlap(TEXTS)


@pytest.fixture(scope="module")
def files():
    return source_files(seed=0)


def test_the_set_covers_every_kind():
    assert len(EVAL) >= 100
    kinds = Counter(e["kind"] for e in EVAL)
    assert set(kinds) == set(KINDS) and min(kinds.values()) >= 12, kinds
    for k in KINDS:  # chat and raw completions in every kind
        assert {e["mode"] for e in EVAL if e["kind"] == k} == {"chat", "raw"}, k
    assert sum(e["long"] for e in EVAL) >= 10
    assert len({e["id"] for e in EVAL}) == len(EVAL)
    assert len(set(TEXTS)) == len(TEXTS)
    lengths = sorted(len(t) for t in TEXTS)
    assert lengths[0] < 40 and lengths[-1] > 1200  # short and long prompts


def test_no_eval_prompt_among_template_and_extra_prompts(overlap):
    train, held = make_prompts(16000, 64, 0)
    for seed, count in ((0, 42000), (1, 100000), (2, 20000), (3, 20000)):  # --data-seed, --extra-prompts of B, C, D, E
        extra = make_extra_prompts(count, 0, avoid=frozenset(train) | frozenset(held), sample_seed=seed)
        bad = [(p, [TEXTS[i] for i in overlap.hits(p)]) for p in extra if overlap.hits(p)]
        assert not bad, bad[:5]
    bad = [(p, [TEXTS[i] for i in overlap.hits(p)]) for p in train + held + bench_prompts() if overlap.hits(p)]
    assert not bad, bad[:5]


def test_no_eval_prompt_among_general_prompts(overlap, files):
    # runs D's and E's count and seed (and the default seed): disjoint before decontamination
    for seed in (0, 2, 3):
        gen = general_prompts(40000, 0, sample_seed=seed, files=files)
        bad = [(g["text"][:100], [TEXTS[i][:100] for i in overlap.hits(g["text"])]) for g in gen if overlap.hits(g["text"])]
        assert not bad, bad[:5]


def test_no_eval_text_in_the_package_sources(files, overlap):
    """No line of an eval prompt (30+ characters) occurs in the files the raw completions and
    passages come from, and no passage or excerpt overlaps an eval prompt."""
    lines = {ln.strip() for t in TEXTS for ln in t.splitlines() if len(ln.strip()) >= 30}
    found = []
    for kind in files:
        for path in files[kind]:
            text = _text(path)
            found += [(path, ln) for ln in lines if ln in text]
    assert not found, found[:5]
    psg = passages(files, seed=0)
    for text in psg["code"] + psg["prose"] + raw_excerpts(files, 3000, seed=2):
        assert not overlap.hits(text), text[:200]


def test_overlap_finds_near_duplicates():
    ov = Overlap(["Write a short thank-you email to a neighbor who watered my plants while I was away."])
    assert ov.hits("write a short thank you email to a neighbor who watered my plants while I was away")
    assert ov.hits("Please write a short thank-you email to a neighbor who watered my plants while I was on holiday.")
    assert not ov.hits("Write a short thank-you email to my teacher.")
