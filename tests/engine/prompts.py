"""Prompts the engine tests share: repetitive ones (n-gram lookup accepts) and open ones."""

PARAGRAPH = (
    "The committee met on Tuesday to review the budget for the new library. After a long "
    "discussion, they agreed to fund the reading room, the children's section and a small cafe."
)

PROMPTS = [
    f"Repeat this paragraph word for word: {PARAGRAPH}\n\n",
    "Once upon a time, in a small village by the sea,",
    "def fibonacci(n):\n    ",
    f"Summarise this paragraph in one sentence: {PARAGRAPH}\nSummary:",
    "The capital of France is",
    "List three colours: red, green,",
    "1, 2, 3, 4, 5, 6,",
    "Question: what is 12 times 12?\nAnswer:",
]


def prompts(n: int) -> list[str]:
    return [PROMPTS[i % len(PROMPTS)] + ("" if i < len(PROMPTS) else f" ({i})") for i in range(n)]
