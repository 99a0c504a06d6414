"""The cases of bench/spec_speedup.py: its workloads (prompts as (kind, chat message)), its
drafters (one row each: target model, engine settings, workload), the targets it checks and
the --quick settings."""
from __future__ import annotations

from dataclasses import dataclass, field

# ---- workloads: prompts as (kind, chat message) -----------------------------------------

PARAGRAPHS = [
    "The committee met on Tuesday to review the budget for the new library. After a long discussion, "
    "they agreed to fund the reading room, the children's section and a small cafe.",
    "Our train left the station at seven in the morning. By noon we had crossed two rivers and a long "
    "valley, and in the evening we reached the old town by the lake, where it was raining.",
    "The bakery on the corner opens at six. It sells bread, small cakes and coffee, and on Sundays the "
    "owner makes apple pies that are usually gone before nine o'clock.",
    "Water boils at one hundred degrees Celsius at sea level. On a high mountain the air pressure is "
    "lower, so water boils at a lower temperature and food takes longer to cook.",
    "The museum has three floors. The first holds old maps and coins, the second paintings from the "
    "last two centuries, and the third a large collection of clocks and musical boxes.",
    "Maria planted tomatoes, beans and sunflowers in her garden this spring. The dry summer was hard on "
    "the beans, but the tomatoes grew well and she gave many of them to her neighbours.",
    "The new bridge is four hundred metres long and took three years to build. It carries two lanes of "
    "traffic, a cycle path and a footpath, and it opened to the public last month.",
    "Every winter the village holds a festival of lights. Families hang lanterns in their windows, the "
    "school choir sings in the square, and the bakery gives out hot chocolate to everyone.",
]
INSTRUCTIONS = [
    ("repeat", "Repeat this paragraph word for word:\n\n{p}"),
    ("summarise", "Summarise this paragraph in one sentence:\n\n{p}"),
    ("repeat", "Copy the following text exactly, without changes:\n\n{p}"),
    ("summarise", "Give a short summary of the text below.\n\n{p}"),
]
CODE_TASKS = [
    "Write a Python function is_palindrome(s) that checks whether a string is a palindrome, ignoring case and spaces.",
    "Write a Python function that returns the n-th Fibonacci number iteratively.",
    "Write a Python function merge_sorted(a, b) that merges two sorted lists into one sorted list.",
    "Write a Python function that counts how often each word occurs in a text and returns a dict.",
    "Write a Python class Stack with push, pop, peek and is_empty methods.",
    "Write a Python function that reads a CSV file and returns the sum of its second column.",
    "Write a Python function binary_search(xs, target) that returns the index of target or -1.",
    "Write a Python function that flattens a nested list of arbitrary depth.",
]


def ngram_prompts(n: int) -> list[tuple[str, list[dict]]]:
    """Repeat and summarise requests, alternating, over distinct paragraphs."""
    out = []
    for i in range(n):
        kind, template = INSTRUCTIONS[(i % 2) + 2 * ((i // len(PARAGRAPHS)) % 2)]
        paragraph = PARAGRAPHS[(i + i // (2 * len(PARAGRAPHS))) % len(PARAGRAPHS)]  # 32 distinct prompts
        out.append((kind, [{"role": "user", "content": template.format(p=paragraph)}]))
    return out


def code_prompts(n: int) -> list[tuple[str, list[dict]]]:
    return [("code", [{"role": "user", "content": CODE_TASKS[i % len(CODE_TASKS)]
                       + ("" if i < len(CODE_TASKS) else f" Call it variant {i // len(CODE_TASKS)}.")}])
            for i in range(n)]


WORKLOADS = {"ngram": ngram_prompts, "code": code_prompts}


# ---- drafters: one row each (adding a drafter is one line) ------------------------------

@dataclass(frozen=True)
class Drafter:
    name: str  # the JSON key prefix: "<name>_b<batch>"
    target: str | None  # the target model spec (None: the default model)
    engine: dict  # EngineConfig fields that select and tune the drafter
    workload: str  # a key of WORKLOADS
    hf_assist: dict  # transformers generate() kwargs of its assisted generation ("assistant_model": spec)
    max_tokens: int  # per request, full run
    b1_prompts: int  # prompts run one after another at batch 1
    leviathan: bool = False  # compare with Leviathan et al.'s predicted speedup
    quick: bool = False  # part of --quick
    max_tokens_by_batch: dict = field(default_factory=dict)  # shorter outputs at large batches (slow models)


DRAFTERS = [
    Drafter("ngram", None, {"drafter": "ngram"}, "ngram", {"prompt_lookup_num_tokens": 10}, max_tokens=128,
            b1_prompts=8, quick=True),
    Drafter("draft_model", "qwen2.5-coder-1.5b", {"drafter": "draft-model", "draft_model": "qwen2.5-coder-0.5b"}, "code",
            {"assistant_model": "qwen2.5-coder-0.5b"}, max_tokens=48, b1_prompts=2, leviathan=True,
            max_tokens_by_batch={8: 32, 32: 32}),
    # DFlash on the n-gram row's prompts, so the two compare directly (transformers has no DFlash);
    # the shipped weights draft block_size - 1 = 7 tokens a round.
    Drafter("dflash", None, {"drafter": "dflash"}, "ngram", {}, max_tokens=128, b1_prompts=8),
]

TARGETS = {"ngram_b1": 2.5, "b32": 1.0, "vs_hf_greedy_b1": 3.0, "leviathan_fraction": 0.9}
QUICK = {"batches": (1, 8), "max_tokens": 64, "b1_prompts": 4}
# batch b > 1 runs WAVES * b requests with b in flight: the batch stays full until the last
# wave drains. A closed batch of b drains to one sequence, and then its slowest sequence
# sets the wall time: drafting that finishes the others sooner only thins the later ticks.
WAVES = 3
