"""General training prompts for the DFlash drafter (scripts/train_dflash.py --general-prompts):
what users send, beyond the template families of scripts/dflash_prompts.py.

Two sources, both on any machine that runs the script:
  - prompts this module generates: chat requests (with and without a system prompt) of
    eight kinds: code in many languages, math and reasoning, lists and tables, long-form
    prose, rewriting and summarising, multilingual, structured output (JSON, YAML, CSV,
    XML) and everyday requests; many ask about a passage (see below), so prompt lengths
    run from a few tokens to ~800;
  - text that ships in the Python packages installed where it runs (sysconfig's stdlib
    and purelib: Python sources, C/C++ headers, package READMEs in dist-info METADATA,
    pydoc's topic texts): cut into passages, used as raw completion prompts (sent as they
    are, no chat template) and as the passages of rewrite / summarise / explain / review
    requests.
Every prompt is (kind, mode, messages-or-text). The evaluation set
(bench/dflash_eval_prompts.py) is never read here except by `decontaminate`, which drops
any training prompt that overlaps an evaluation prompt (tests/dflash checks none does).
"""
from __future__ import annotations

import os
import random
import re

from dflash_prompts import CODE_TASKS, EXTRA_CODE_TASKS, EXTRA_SUBJECTS, SUBJECTS, held_out_split
from dflash_sources import passages, raw_excerpts, source_files

KINDS = ("code", "math", "lists", "prose", "rewrite", "multilingual", "structured", "everyday", "raw")

LANGUAGES = ["Python", "JavaScript", "TypeScript", "Go", "Rust", "Java", "C", "C++", "C#", "Ruby", "PHP", "Kotlin",
             "Swift", "bash", "SQL", "R", "Lua", "Haskell", "Scala", "Perl"]
MORE_TASKS = [
    "parses a date string in the format YYYY-MM-DD", "implements a stack with push, pop and peek",
    "implements a queue using two stacks", "computes the nth triangular number", "finds all prime numbers below n",
    "counts the number of set bits in an integer", "transposes a matrix", "multiplies two matrices",
    "checks whether brackets in a string are balanced", "converts a Roman numeral to an integer",
    "converts an integer to a Roman numeral", "finds the longest common prefix of a list of strings",
    "computes the Levenshtein distance of two strings", "implements a simple LRU cache", "parses a URL query string",
    "reads a text file and prints the ten most common words", "downloads a web page and prints its title",
    "retries a function call with exponential backoff", "implements a linked list with insert and delete",
    "finds the shortest path in a grid with breadth-first search", "implements quicksort", "implements merge sort",
    "serializes a dictionary to JSON and writes it to a file", "validates a phone number with a regular expression",
    "computes a running average over a stream of numbers", "generates all permutations of a list",
    "groups a list of records by a key", "debounces a function", "converts snake_case to camelCase",
    "computes the checksum of a file", "formats a number with thousands separators",
    "implements a binary search tree with insert and search", "computes the day of the week for a date",
    "paginates a list of items", "merges overlapping intervals", "checks whether a graph has a cycle",
]
CODE_ASKS = [
    "Write a {lang} function that {task}.", "In {lang}, how would I write code that {task}?",
    "Implement a {lang} program that {task}. Add comments.", "Give me {lang} code that {task}, and explain it briefly.",
    "Can you show an idiomatic {lang} solution that {task}?", "I need a {lang} snippet that {task}. Include a usage example.",
    "Write unit tests in {lang} for a function that {task}.", "What is the time complexity of code that {task}? Show a {lang} version.",
]
SQL_ASKS = [
    "Write a SQL query that returns the {n} most recent orders from a table orders(id, customer_id, created_at, total).",
    "Write SQL to count customers per country from customers(id, name, country).",
    "Write a SQL statement that creates a table for {x} with an id primary key and three other columns.",
    "How do I join a table of {x} with a table of their owners in SQL? Give an example query.",
    "Write a SQL query that computes the average {col} per month from a table measurements(day, {col}).",
]
CODE_ON_PASSAGE = [
    "Explain what this code does:\n\n{p}", "Review this code and point out possible bugs:\n\n{p}",
    "Add a docstring and comments to this code:\n\n{p}", "Rewrite this code to be easier to read:\n\n{p}",
    "What would be a good unit test for this code?\n\n{p}", "Translate this code into {lang}:\n\n{p}",
    "{p}\n\nWhat does the function above return?", "Summarize in plain English what this code is for:\n\n{p}",
]
LIST_ASKS = [
    "Make a list of {n} ideas related to {x}.", "Give me a checklist for {x}.", "Create a markdown table about {x} with {n} rows.",
    "List {n} facts about {x} as bullet points.", "Make a table with the pros and cons of {x}.",
    "Number the steps someone should follow to get started with {x}.", "Put together a {n}-item reading list about {x}.",
    "Create a comparison table of {x} and {y}.", "Write a to-do list for a weekend project involving {x}.",
    "List {n} words in English related to {x}, with a short definition each.", "Give me a table of {n} {x} facts with a source column.",
    "Outline a presentation about {x} as a nested list.",
]
PROSE_ASKS = [
    "Write a long essay about {x}.", "Write a detailed article about {x}, with headings.", "Write a story of several paragraphs about {x}.",
    "Write a long blog post about {x} for beginners.", "Write a chapter of a novel in which {x} plays a central role.",
    "Write a personal essay about what {x} taught me.", "Write a magazine feature about {x}.",
    "Write a detailed report on {x} for a general audience.", "Write a long letter to a friend describing {x}.",
    "Write a speech of about five minutes about {x}.", "Write an opinion piece arguing for more attention to {x}.",
    "Write a story for adults about {x} and {y}.",
]
REWRITE_ASKS = [
    "Summarize the following text:\n\n{p}", "Give me the key points of this text as bullet points:\n\n{p}",
    "Rewrite this in simpler language:\n\n{p}", "Rewrite this passage in a more formal tone:\n\n{p}",
    "Shorten the following to two sentences:\n\n{p}", "Paraphrase this:\n\n{p}", "Proofread and correct this text:\n\n{p}",
    "{p}\n\nSummarize the text above in one paragraph.", "Turn this text into a short FAQ:\n\n{p}",
    "Write a title and a one-line summary for this text:\n\n{p}", "Rewrite this as an email to a colleague:\n\n{p}",
    "Explain this text to a beginner:\n\n{p}", "{p}\n\nWhat is the main idea of this passage?",
    "Make this sound friendlier:\n\n{p}", "Condense this into a tweet:\n\n{p}",
]
TRANSLATE_ASKS = [
    "Translate into {lang}:\n\n{p}", "Translate this text to {lang}:\n\n{p}", "How would you say this in {lang}?\n\n{p}",
    "Please translate the following into {lang}.\n\n{p}",
]
TARGET_LANGS = ["French", "Spanish", "German", "Italian", "Portuguese", "Dutch", "Chinese", "Japanese", "Russian", "Polish",
                "Turkish", "Swedish"]
# chat requests written in other languages: template with {x} a topic in that language
FOREIGN = {
    "fr": (["Parle-moi de {x}.", "Écris un petit texte sur {x}.", "Quels sont les avantages de {x} ?",
            "Explique {x} simplement.", "Donne-moi cinq idées sur {x}.", "Écris un poème sur {x}.",
            "Pourquoi {x} est-il important ?", "Rédige un courriel à propos de {x}."],
           ["la mer", "le vélo", "la cuisine française", "les vacances", "le travail à distance", "les chats", "la musique",
            "le jardinage", "la ville de Lyon", "les montagnes", "l'école", "le café", "les transports publics", "la lecture"]),
    "es": (["Háblame de {x}.", "Escribe un texto corto sobre {x}.", "¿Qué ventajas tiene {x}?", "Explica {x} con palabras sencillas.",
            "Dame cinco ideas sobre {x}.", "Escribe un poema sobre {x}.", "¿Por qué es importante {x}?",
            "Escribe un correo sobre {x}."],
           ["el fútbol", "la playa", "la comida mexicana", "los perros", "el verano", "la familia", "el reciclaje",
            "la ciudad de Sevilla", "los idiomas", "la salud", "el cine", "las plantas", "la tecnología", "los viajes"]),
    "de": (["Erzähl mir etwas über {x}.", "Schreibe einen kurzen Text über {x}.", "Was sind die Vorteile von {x}?",
            "Erkläre {x} einfach.", "Nenne fünf Ideen zu {x}.", "Schreibe ein Gedicht über {x}.",
            "Warum ist {x} wichtig?", "Schreibe eine E-Mail über {x}."],
           ["den Wald", "das Fahrrad", "die deutsche Küche", "den Winter", "die Arbeit", "Hunde", "die Schule", "das Wetter",
            "die Stadt Hamburg", "Bücher", "den Sport", "das Internet", "Freundschaft", "den Urlaub"]),
    "it": (["Parlami di {x}.", "Scrivi un breve testo su {x}.", "Quali sono i vantaggi di {x}?", "Spiega {x} in modo semplice.",
            "Scrivi una poesia su {x}."],
           ["la pizza", "il mare", "la famiglia", "la musica", "Firenze", "il calcio", "l'estate", "gli animali"]),
    "pt": (["Fale-me sobre {x}.", "Escreva um texto curto sobre {x}.", "Quais são as vantagens de {x}?",
            "Explique {x} de forma simples."],
           ["o futebol", "a praia", "a comida brasileira", "a música", "Lisboa", "os livros", "a natureza"]),
    "nl": (["Vertel me iets over {x}.", "Schrijf een korte tekst over {x}.", "Waarom is {x} belangrijk?"],
           ["de fiets", "Amsterdam", "het weer", "de zee", "koffie", "het werk"]),
}
STRUCT_ASKS = [
    "Return a JSON object that describes {x}, with at least five fields.", "Give me a JSON array of {n} example records about {x}.",
    "Write a JSON schema for data about {x}.", "Produce a YAML file that configures an application about {x}.",
    "Write a CSV file with {n} rows of sample data about {x}.", "Output an XML document describing {x}.",
    "Describe {x} as a JSON object with the keys name, summary, facts and tags.",
    "Give me a TOML configuration for a tool that manages {x}.", "Create sample JSON for an API response listing {x}.",
    "Extract the key facts of this text as JSON:\n\n{p}", "Convert the main points of this text to a JSON list:\n\n{p}",
    "Write a JSON object with the fields id, title, tags and created_at for a note about {x}.",
]
EVERYDAY_ASKS = [
    "How do I {h}?", "What is the best way to {h}?", "Any tips on how to {h}?", "I want to {h}. Where should I start?",
    "Can you explain how to {h}, step by step?", "What do I need to {h}?", "Is it hard to {h}?",
]
HOWTO = [
    "clean a cast iron pan", "make bread at home", "fix a leaking tap", "save money on groceries", "learn to swim as an adult",
    "write a cover letter", "plan a birthday party", "grow tomatoes on a balcony", "train a puppy", "make cold brew coffee",
    "prepare for a job interview", "improve my sleep", "start running", "pack a suitcase efficiently", "make a budget",
    "remove a coffee stain", "set up a home network", "choose a laptop", "cook rice without a rice cooker", "organize my closet",
    "write a thank-you letter", "make friends in a new city", "keep houseplants alive", "study for an exam",
    "back up my phone", "change a light switch", "make a simple soup", "care for a cat", "negotiate a salary",
    "write a complaint letter", "bake a chocolate cake", "reduce stress at work", "learn to play the guitar",
    "plan a trip to Japan", "speak in public", "paint a room", "sharpen a kitchen knife", "make homemade pasta",
]
EVERYDAY_WRITE = [
    "Write a short note to {w}.", "Write a message inviting {w} to dinner.", "Write an apology email to {w}.",
    "Write a congratulations card for {w}.", "Write a polite reminder to {w} about a meeting.",
    "Write a farewell message to {w}.", "Write a short toast for {w}.",
]
WHO = ["my landlord", "a coworker who is retiring", "my sister", "a new neighbor", "my teacher", "a client", "my team",
       "an old friend", "my manager", "the school principal", "a customer", "my grandparents"]
FACT_ASKS = ["What is {x}?", "Tell me something about {x}.", "Who first studied {x}?", "Where can I learn about {x}?",
             "Quick question: what do people use {x} for?", "Give me a fact about {x} I probably don't know."]
SYSTEMS = [None, None, None, "You are a helpful assistant.", "You are a concise assistant. Answer briefly.",
           "You are an expert programmer.", "You are a friendly tutor who explains things simply.",
           "You are a professional writer.", "You answer in a formal tone.", "You are a helpful assistant that replies in JSON when asked for data."]


def _math(r: random.Random) -> str:
    a, b, c, d = r.randint(2, 999), r.randint(2, 99), r.randint(2, 30), r.randint(1, 12)
    return r.choice([
        f"Compute {a} * {b} and show the steps.", f"What is {a} divided by {c}, rounded to two decimals?",
        f"Solve for x: {c}x - {b} = {a}.", f"Find x if x/{c} + {b} = {a}.",
        f"A store discounts a {a} dollar item by {b % 50 + 5}%. What is the new price?",
        f"If {c} workers build a wall in {d + 2} days, how long do {c + d} workers need?",
        f"What is the area of a triangle with base {c} and height {b}?",
        f"Simplify the fraction {a * d}/{b * d}.", f"What is {b}% of {a}?", f"Convert {a} minutes into hours and minutes.",
        f"Is {a} divisible by {c}? Explain.", f"Find the next number in the sequence {d}, {2 * d}, {4 * d}, {8 * d}, ...",
        f"A recipe needs {d} eggs for {c} people. How many eggs for {b} people?",
        f"What is the square root of {c * c}? And of {a}, approximately?", f"Expand (x + {c})(x - {d}).",
        f"Differentiate f(x) = {c}x^{d % 5 + 2} + {b}x.", f"Integrate {c}x^{d % 4 + 1} dx.",
        f"Two trains leave stations {a} km apart and travel toward each other at {b} and {c + 40} km/h. When do they meet?",
        f"What is the probability of rolling a sum of {d % 11 + 2} with two dice?",
        f"Explain step by step how to find the least common multiple of {b} and {c}.",
        f"I earn {a * 10} a month and spend {b}% on rent. How much is left?", f"Write {a} in binary and in hexadecimal.",
        f"Riddle: I am a number; double me and add {c}, you get {2 * b + c}. What am I?",
        f"If today is {['Monday', 'Tuesday', 'Wednesday', 'Thursday', 'Friday'][d % 5]}, what day is it in {a} days?",
    ])


# ---- the prompts ------------------------------------------------------------------------------

def topic_pool(seed: int = 0) -> list[str]:
    """The training subjects (held-out subjects of make_prompts, and any sharing a word with
    them, left out)."""
    held, _ = held_out_split(seed)
    stop = {"a", "an", "the", "of", "and", "in", "at", "to", "on", "new", "first", "day", "old"}
    held_words = {w for s in held for w in s.lower().split() if w not in stop}
    return [s for s in dict.fromkeys(SUBJECTS + EXTRA_SUBJECTS) if s not in held and not set(s.lower().split()) & held_words]


def general_prompts(count: int, seed: int = 0, sample_seed: int | None = None, files=None) -> list[dict]:
    """`count` prompts {kind, mode: "chat" (messages) | "raw" (text), ...}, a mix of the
    kinds (raw completions ~17%), without exact duplicates."""
    r = random.Random((seed if sample_seed is None else sample_seed) + 13)
    topics = topic_pool(seed)
    _, held_tasks = held_out_split(seed)
    tasks = [t for t in CODE_TASKS if t not in held_tasks] + EXTRA_CODE_TASKS + MORE_TASKS
    files = source_files(seed=seed) if files is None else files
    psg = passages(files, seed=seed)
    code_p, prose_p = psg["code"] or ["x = 1\ny = 2\nprint(x + y)"], psg["prose"] or ["(no text found)"]
    raws = raw_excerpts(files, count // 4 + 10, seed=(seed if sample_seed is None else sample_seed))

    def prose_passage():  # one to four paragraphs: short to long contexts
        return "\n\n".join(r.choice(prose_p) for _ in range(r.choice([1, 1, 1, 2, 3, 4])))

    def chat(kind: str) -> str:
        x, y = r.sample(topics, 2)
        n = r.choice([3, 4, 5, 6, 7, 8, 10, 12])
        if kind == "code":
            u = r.random()
            if u < 0.55:
                return r.choice(CODE_ASKS).format(lang=r.choice(LANGUAGES), task=r.choice(tasks))
            if u < 0.65:
                return r.choice(SQL_ASKS).format(n=n, x=x, col=r.choice(["temperature", "price", "score", "duration"]))
            return r.choice(CODE_ON_PASSAGE).format(p=r.choice(code_p), lang=r.choice(LANGUAGES))
        if kind == "math":
            return _math(r)
        if kind == "lists":
            return r.choice(LIST_ASKS).format(n=n, x=x, y=y)
        if kind == "prose":
            return r.choice(PROSE_ASKS).format(x=x, y=y)
        if kind == "rewrite":
            return r.choice(REWRITE_ASKS).format(p=prose_passage())
        if kind == "multilingual":
            if r.random() < 0.45:
                t, subs = FOREIGN[r.choice(list(FOREIGN))]
                return r.choice(t).format(x=r.choice(subs))
            p = r.choice(prose_p)
            return r.choice(TRANSLATE_ASKS).format(lang=r.choice(TARGET_LANGS), p=p[: r.choice([200, 500, 1200])])
        if kind == "structured":
            return r.choice(STRUCT_ASKS).format(x=x, n=n, p=prose_passage())
        u = r.random()  # everyday
        if u < 0.45:
            return r.choice(EVERYDAY_ASKS).format(h=r.choice(HOWTO))
        if u < 0.7:
            return r.choice(EVERYDAY_WRITE).format(w=r.choice(WHO))
        return r.choice(FACT_ASKS).format(x=x)

    # rewrite and multilingual weigh more: their targets copy or translate a passage, the
    # stretches an n-gram drafter wins on and the drafter saw least of
    weights = [("code", 16), ("math", 9), ("lists", 10), ("prose", 9), ("rewrite", 15), ("multilingual", 13),
               ("structured", 10), ("everyday", 10), ("raw", 19)]
    kinds = [k for k, _ in weights]
    out, seen = [], set()
    for _ in range(count * 20):
        if len(out) >= count:
            break
        kind = r.choices(kinds, [w for _, w in weights])[0]
        if kind == "raw":
            if not raws:
                continue
            text = raws.pop()
            key = ("raw", text)
            item = {"kind": "raw", "mode": "raw", "text": text}
        else:
            text = chat(kind)
            system = r.choice(SYSTEMS)
            key = (system, text)
            msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
            item = {"kind": kind, "mode": "chat", "messages": msgs, "text": text}
        if key not in seen:
            seen.add(key)
            out.append(item)
    return out


# ---- decontamination against the evaluation set --------------------------------------------------

def _shingles(text: str, n: int = 5) -> set[tuple[str, ...]]:
    words = re.findall(r"\w+", text.lower())
    if len(words) < n:
        return {tuple(words)} if words else set()
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


class Overlap:
    """Near-duplicate check against a set of reference texts: a text overlaps a reference
    when they are equal up to case, punctuation and spacing, or when a share >= `share`
    of the reference's word 5-grams occur in the text."""

    def __init__(self, refs: list[str], share: float = 0.5):
        self.refs, self.share = refs, share
        self.norm = {" ".join(re.findall(r"\w+", t.lower())): i for i, t in enumerate(refs)}
        self.sh = [_shingles(t) for t in refs]
        self.index: dict[tuple, list[int]] = {}
        for i, s in enumerate(self.sh):
            for g in s:
                self.index.setdefault(g, []).append(i)

    def hits(self, text: str) -> list[int]:
        """The references `text` overlaps."""
        found = set()
        key = " ".join(re.findall(r"\w+", text.lower()))
        if key in self.norm:
            found.add(self.norm[key])
        counts: dict[int, int] = {}
        for g in _shingles(text):
            for i in self.index.get(g, ()):
                counts[i] = counts.get(i, 0) + 1
        found |= {i for i, c in counts.items() if c >= self.share * len(self.sh[i])}
        return sorted(found)


def eval_set_texts() -> list[str]:
    """The evaluation prompts' texts (bench/dflash_eval_prompts.py), for decontamination only."""
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
    from dflash_eval_prompts import eval_prompts

    return [e["prompt"] for e in eval_prompts()]


def decontaminate(texts: list[str], refs: list[str] | None = None) -> list[bool]:
    """Per text: True to keep it (it overlaps no evaluation prompt)."""
    ov = Overlap(eval_set_texts() if refs is None else refs)
    return [not ov.hits(t) for t in texts]
