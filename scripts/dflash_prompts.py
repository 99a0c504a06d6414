"""Prompts for training a DFlash drafter (scripts/train_dflash.py): chat requests built
from templates x subjects, training-only extra material, user turns the target writes
itself, and the held-out split that evaluation keeps apart."""
from __future__ import annotations

import os
import random
import sys

import torch

def _split(subjects: str) -> list[str]:
    """A "|"-separated list written over several lines."""
    return [x.strip() for x in subjects.replace("\n", "").split("|") if x.strip()]


# ---- prompts ---------------------------------------------------------------------------

SUBJECTS = """cats|dogs|elephants|dolphins|owls|honey bees|penguins|sharks|horses|butterflies|wolves|octopuses|
ants|eagles|frogs|whales|tigers|parrots|spiders|camels|the ocean|volcanoes|rainforests|deserts|mountains|rivers|
the moon|the sun|black holes|the stars|clouds|rain|snow|earthquakes|photosynthesis|climate change|recycling|
coral reefs|glaciers|thunderstorms|tides|the seasons|wind power|computers|the internet|smartphones|
artificial intelligence|robots|electric cars|solar panels|batteries|video games|social media|programming|
databases|encryption|3D printing|cloud computing|email|search engines|open source software|coffee|tea|bread|
pizza|chocolate|gardening|cooking pasta|running|yoga|sleep|music|painting|reading books|friendship|
time management|saving money|learning a new language|traveling|camping|birthdays|board games|photography|
swimming|chess|knitting|baking cookies|public speaking|meditation|gravity|electricity|magnets|atoms|DNA|
vaccines|the human heart|the brain|bacteria|evolution|dinosaurs|light|sound waves|the periodic table|
volcanic rocks|the water cycle|the immune system|nutrition|the Roman Empire|ancient Egypt|the pyramids|
the printing press|the Olympic Games|democracy|libraries|museums|trains|airplanes|bicycles|the telephone|
the industrial revolution|castles|pirates|the Silk Road|doctors|teachers|firefighters|farmers|pilots|chefs|
astronauts|scientists|artists|nurses|engineers|librarians|a rainy day|a small village|a lost key|a birthday party|
a long journey|a haunted house|a secret garden|a talking tree|a brave knight|a curious robot|a friendly dragon|
a city at night|the first day of school|a snowy morning|a picnic in the park|a trip to the beach|homework|
exercise|healthy breakfasts|drinking water|kindness|honesty|teamwork|patience|creativity|curiosity|
remote work|job interviews|writing a resume|starting a small business|online shopping|advertising|
the stock market|taxes|insurance|renewable energy|nuclear power|oil|plastic pollution|forests|bees and flowers|
the Amazon river|the Sahara|Antarctica|Mount Everest|the Pacific Ocean|Paris|Tokyo|New York|London|
mathematics|fractions|prime numbers|geometry|statistics|probability|algebra|the Pythagorean theorem|
poetry|novels|movies|theater|dance|jazz|the piano|the guitar|comic books|fairy tales|superheroes|
volunteering|city parks|public transport|bridges|skyscrapers|roads|the post office|hospitals|airports|
sleep schedules|stress|happiness|habits|goal setting|memory|dreams|emotions|laughter|pets|zoos|aquariums"""
SUBJECTS = _split(SUBJECTS)

TEMPLATES = [
    "Write a short story about {x}.",
    "Explain {x} to a ten-year-old.",
    "What is {x}? Answer in a few sentences.",
    "Give me three interesting facts about {x}.",
    "Write a poem about {x}.",
    "List five things people should know about {x}.",
    "Describe {x} in detail.",
    "What are the pros and cons of {x}?",
    "Write the introduction of a blog post about {x}.",
    "How would you teach someone about {x}?",
    "Summarize why {x} matters, in one paragraph.",
    "Write a friendly email to a colleague about {x}.",
    "What is the history of {x}?",
    "Why is {x} important?",
    "Write a haiku about {x}.",
    "Give me some practical tips about {x}.",
    "Write a quiz question about {x}, then give the answer.",
    "Tell me a joke about {x}.",
    "What are common misconceptions about {x}?",
    "Write a short dialogue between two friends talking about {x}.",
    "Explain how {x} works, step by step.",
    "Write a tweet about {x}.",
    "What would the world be like without {x}?",
    "Write a children's song about {x}.",
    "Give a one-sentence definition of {x}, then an example.",
    "I am writing a school report on {x}. Can you help me with an outline?",
    "What questions do people often ask about {x}?",
    "Write a motivational message inspired by {x}.",
    "Describe a day in the life of someone who loves {x}.",
    "Can you give me a simple summary of {x}?",
]
PAIR_TEMPLATES = [
    "Compare {x} and {y}.",
    "What do {x} and {y} have in common?",
    "Write a short story that involves {x} and {y}.",
    "Which is more interesting, {x} or {y}? Explain.",
]
CODE_TASKS = [
    "reverses a string", "checks if a number is prime", "computes the factorial of n", "sorts a list of numbers",
    "counts the vowels in a string", "finds the largest value in a list", "merges two sorted lists",
    "returns the first n Fibonacci numbers", "removes duplicates from a list", "checks whether a word is a palindrome",
    "converts Celsius to Fahrenheit", "counts the lines in a text file", "computes the average of a list",
    "finds the second smallest number in a list", "capitalizes every word in a sentence", "computes the greatest common divisor of two numbers",
    "checks whether two strings are anagrams", "flattens a nested list", "counts how often each word appears in a text",
    "returns the sum of the digits of a number", "converts a number to binary", "validates an email address",
    "finds the longest word in a sentence", "rotates a list by k positions", "checks if a year is a leap year",
]
CODE_TEMPLATES = [
    "Write a Python function that {t}.",
    "Write a JavaScript function that {t}.",
    "How do I write a program that {t}? Show the code.",
    "Write a C function that {t}.",
]


MODIFIERS = ["", "", "", " Keep it short.", " Use simple words.", " Answer in detail.", " Use a numbered list.",
             " Write it for a child.", " Make it funny.", " Use a formal tone.", " Answer in two paragraphs.",
             " Start with a one-line summary.", " Use bullet points.", " Explain it like a teacher would."]


def _math_prompt(rng: random.Random) -> str:
    a, b, c = rng.randint(2, 99), rng.randint(2, 99), rng.randint(2, 20)
    return rng.choice([
        f"What is {a} plus {b}?",
        f"What is {a} times {c}?",
        f"If I have {a} apples and give away {min(a, b)}, how many do I have left?",
        f"Solve for x: {c}x + {a} = {a + c * b}.",
        f"A train travels {a} kilometers in {c} hours. What is its average speed?",
        f"What is {a} percent of {b * 10}?",
        f"Is {a * c + 1} a prime number? Explain.",
    ])


def make_prompts(num_train: int, num_eval: int, seed: int = 0, modifiers: bool = False) -> tuple[list[str], list[str]]:
    """Chat requests for training, and held-out ones whose subjects, code tasks and numbers
    never appear in training; with `modifiers`, most training requests end with a style
    request (held-out ones never do, so acceptance stays comparable between runs)."""
    rng = random.Random(seed)
    subjects = SUBJECTS[:]
    rng.shuffle(subjects)
    n_held = max(2, len(subjects) // 8)
    held, train = subjects[:n_held], subjects[n_held:]
    tasks = CODE_TASKS[:]
    rng.shuffle(tasks)
    held_tasks, train_tasks = tasks[:4], tasks[4:]

    def draw(pool, tasks, r, styled):
        kind = r.random()
        if kind < 0.62:
            return r.choice(TEMPLATES).format(x=r.choice(pool)) + (r.choice(MODIFIERS) if styled else "")
        if kind < 0.77:
            x, y = r.sample(pool, 2)
            return r.choice(PAIR_TEMPLATES).format(x=x, y=y) + (r.choice(MODIFIERS) if styled else "")
        if kind < 0.9:
            return r.choice(CODE_TEMPLATES).format(t=r.choice(tasks))
        return _math_prompt(r)

    def unique(n, pool, tasks, r, avoid=frozenset(), styled=False):
        out, seen = [], set(avoid)
        for _ in range(n * 50):
            if len(out) >= n:
                break
            p = draw(pool, tasks, r, styled)
            if p not in seen:
                seen.add(p)
                out.append(p)
        return out

    train_prompts = unique(num_train, train, train_tasks, rng, styled=modifiers)
    eval_prompts = unique(num_eval, held, held_tasks, random.Random(seed + 1), avoid=frozenset(train_prompts))
    return train_prompts, eval_prompts


# Training-only prompt material (--extra-prompts): more subjects, templates and code tasks,
# never used for the held-out prompts, so those stay the same as with --num-prompts alone.
# The template prompts saturate early (30 templates x ~190 subjects; 84 code prompts), so
# a larger template set is mostly pairs and arithmetic; these widen the single-subject part.
EXTRA_SUBJECTS = """lions|giraffes|zebras|koalas|kangaroos|pandas|polar bears|foxes|rabbits|squirrels|hedgehogs|bats|
crocodiles|turtles|snakes|lizards|jellyfish|starfish|crabs|salmon|seahorses|flamingos|peacocks|crows|hummingbirds|
ladybugs|mosquitoes|earthworms|mushrooms|cactus plants|sunflowers|roses|oak trees|bamboo|seaweed|lakes|waterfalls|
caves|islands|canyons|hurricanes|tornadoes|fog|rainbows|lightning|auroras|comets|asteroids|Mars|Jupiter|Saturn's rings|
the Milky Way|telescopes|satellites|rockets|space stations|microscopes|thermometers|clocks|calendars|maps|compasses|
lighthouses|windmills|dams|tunnels|elevators|escalators|washing machines|refrigerators|microwave ovens|vacuum cleaners|
light bulbs|printers|keyboards|headphones|cameras|televisions|radios|drones|self-driving cars|submarines|ships|
hot air balloons|motorcycles|buses|subways|traffic lights|parking|spreadsheets|passwords|computer viruses|
web browsers|operating systems|compilers|algorithms|data science|machine learning|virtual reality|blockchain|
quantum computers|semiconductors|Wi-Fi|GPS|barcodes|soup|rice|cheese|apples|bananas|strawberries|potatoes|tomatoes|
carrots|honey|ice cream|pancakes|sandwiches|salads|spices|vegetarian food|breakfast cereal|lemonade|milk|
hiking|cycling|skiing|surfing|tennis|basketball|soccer|baseball|marathons|gymnastics|martial arts|fishing|
bird watching|woodworking|pottery|sewing|origami|calligraphy|singing|drawing|writing letters|journaling|
puzzles|card games|magic tricks|camping gear|road trips|hotels|museums of science|amusement parks|festivals|
weddings|holidays|New Year's Eve|family dinners|grandparents|siblings|neighbors|roommates|babysitting|
moving to a new city|the first day at a new job|retirement|college applications|exams|scholarships|summer jobs|
recipes|grocery shopping|budgeting|credit cards|banks|loans|inflation|trade|supply and demand|factories|
farming|fishing boats|mining|construction|architecture|interior design|fashion|shoes|umbrellas|backpacks|
glasses|watches|jewelry|perfume|soap|toothbrushes|haircuts|sunscreen|first aid|headaches|colds and flu|
allergies|vitamins|sugar|salt|caffeine|posture|walking|stretching|breathing|loneliness|confidence|gratitude|
forgiveness|courage|leadership|negotiation|decision making|problem solving|critical thinking|debate|
journalism|newspapers|podcasts|radio shows|cartoons|animation|sculpture|architecture in ancient Greece|
the Renaissance|the Vikings|the Aztecs|the Great Wall of China|the Titanic|the Moon landing|the Cold War|
medieval knights|samurai|the Wild West|ancient Rome's roads|the invention of the wheel|the steam engine|
electric guitars|violins|drums|orchestras|opera|hip hop|rock music|folk songs|lullabies|nursery rhymes|
detective stories|science fiction|myths and legends|dragons in folklore|ghost stories|time travel|
a lighthouse keeper|a lonely astronaut|a clever fox|a lost puppy|a magic book|a broken clock|a hidden door|
a treasure map|a summer festival|a mountain village|a busy train station|a quiet library|an old bookstore|
a school science fair|a rainy afternoon|a snowstorm|a camping trip|a new neighbor|a family reunion|
a stolen painting|a missing cat|a robot chef|a tiny dragon|a talking cat|a wise old owl|an underwater city"""
EXTRA_SUBJECTS = _split(EXTRA_SUBJECTS)

EXTRA_TEMPLATES = [
    "Tell me about {x}.",
    "Write a short essay about {x}.",
    "Write a paragraph about {x} for a school newsletter.",
    "What are five fun facts about {x}?",
    "Explain {x} in simple terms.",
    "Write a limerick about {x}.",
    "Write a product description inspired by {x}.",
    "Write a news headline and a short article about {x}.",
    "What are the main benefits of {x}?",
    "What are the risks or downsides of {x}?",
    "Give me a step-by-step guide related to {x}.",
    "Write a short speech about {x}.",
    "Write a diary entry about {x}.",
    "How has {x} changed over time?",
    "What do scientists know about {x}?",
    "Write three questions and answers about {x}.",
    "Describe {x} to someone who has never seen it.",
    "Write a bedtime story about {x}.",
    "What is the most surprising thing about {x}?",
    "Give me a list of ten words related to {x}.",
    "Write a short review of a book about {x}.",
    "How can children learn about {x}?",
    "Write an acrostic poem about {x}.",
    "What careers are related to {x}?",
    "Write a riddle about {x} and give the answer.",
    "Explain the basics of {x}.",
    "Write a persuasive paragraph about {x}.",
    "Describe the future of {x}.",
    "What is a common mistake people make about {x}?",
    "Write a short letter to a friend about {x}.",
    "Write a social media post about {x}.",
    "What would you tell a beginner about {x}?",
    "Write a short scene for a play about {x}.",
    "Create a lesson plan about {x}.",
    "Why do people like {x}?",
    "What is the difference between facts and myths about {x}?",
    "Write a short fable about {x} with a moral.",
    "Give me an analogy that explains {x}.",
    "Write a short FAQ about {x}.",
    "Summarize {x} in three bullet points.",
]
EXTRA_PAIR_TEMPLATES = [
    "What is the difference between {x} and {y}?",
    "Write a poem about {x} and {y}.",
    "How are {x} and {y} connected?",
    "Write a dialogue between {x} and {y}.",
    "Explain {x} using {y} as an example.",
    "Make a list of similarities and differences between {x} and {y}.",
]
EXTRA_CODE_TASKS = [
    "counts the words in a sentence", "reverses the words in a sentence", "checks if a list is sorted",
    "finds the index of an item in a list", "computes the power of a number", "converts a string to uppercase",
    "returns the squares of a list of numbers", "finds the common elements of two lists", "computes the median of a list",
    "generates a random password", "checks whether a number is even", "sums the even numbers in a list",
    "converts minutes to hours and minutes", "counts the characters in a string", "finds the minimum and maximum of a list",
    "implements binary search", "implements bubble sort", "builds a dictionary from two lists",
    "removes whitespace from a string", "checks whether a string contains only digits", "computes compound interest",
    "prints a multiplication table", "computes the area of a circle", "reads a CSV file and prints each row",
    "splits a list into chunks of size n", "computes the distance between two points", "checks if a number is a perfect square",
    "converts a list of strings to integers", "finds the most common element in a list", "counts the uppercase letters in a string",
]
EXTRA_CODE_TEMPLATES = CODE_TEMPLATES + [
    "Write a Java method that {t}.",
    "Write a Go function that {t}.",
    "Show me Python code that {t}, with comments.",
    "Write a Rust function that {t}.",
    "Explain how to write a function that {t}, then show it in Python.",
]


def held_out_split(seed: int = 0) -> tuple[list[str], list[str]]:
    """The held-out subjects and code tasks of make_prompts(..., seed) (the same shuffles)."""
    rng = random.Random(seed)
    subjects = SUBJECTS[:]
    rng.shuffle(subjects)
    tasks = CODE_TASKS[:]
    rng.shuffle(tasks)
    return subjects[: max(2, len(subjects) // 8)], tasks[:4]


def make_extra_prompts(count: int, seed: int = 0, avoid=frozenset(), sample_seed: int | None = None) -> list[str]:
    """Training-only prompts from the training subjects and EXTRA_SUBJECTS (without any that
    shares a word with a held-out subject), TEMPLATES + EXTRA_TEMPLATES, and the training
    code tasks + EXTRA_CODE_TASKS; none in `avoid`. `seed` is make_prompts' (it fixes the
    held-out split); `sample_seed` (default `seed`) draws the prompts."""
    held, held_tasks = held_out_split(seed)
    stop = {"a", "an", "the", "of", "and", "in", "at", "to", "on", "new", "first", "day", "old"}
    held_words = {w for s in held for w in s.lower().split() if w not in stop}
    pool = [s for s in SUBJECTS if s not in held] + [
        s for s in EXTRA_SUBJECTS if s not in SUBJECTS and not set(s.lower().split()) & held_words]
    tasks = [t for t in CODE_TASKS if t not in held_tasks] + EXTRA_CODE_TASKS
    templates, pairs = TEMPLATES + EXTRA_TEMPLATES, PAIR_TEMPLATES + EXTRA_PAIR_TEMPLATES
    r = random.Random((seed if sample_seed is None else sample_seed) + 7)
    out, seen = [], set(avoid)
    for _ in range(count * 50):
        if len(out) >= count:
            break
        kind = r.random()
        if kind < 0.6:
            p = r.choice(templates).format(x=r.choice(pool))
        elif kind < 0.77:
            x, y = r.sample(pool, 2)
            p = r.choice(pairs).format(x=x, y=y)
        elif kind < 0.9:
            p = r.choice(EXTRA_CODE_TEMPLATES).format(t=r.choice(tasks))
        else:
            p = _math_prompt(r)
        if p not in seen:
            seen.add(p)
            out.append(p)
    return out


@torch.inference_mode()
def self_sampled_prompts(model, tokenizer, count: int, batch: int, max_len: int = 64, temperature: float = 1.0,
                         top_k: int = 50, seed: int = 0) -> list[list[int]]:
    """Chat prompts whose user turn the target writes itself (as Magpie does): the chat
    template up to the start of a user turn, sampled until the turn ends; duplicates and
    empty turns are dropped. Returns prompt token ids ending at the assistant's turn."""
    from tandem.model.kv_cache import fixed_tables

    head = tokenizer.apply_chat_template([{"role": "user", "content": "@@"}], tokenize=False, add_generation_prompt=True)
    before, after = head.split("@@")
    prefix, suffix = tokenizer(before).input_ids, tokenizer(after).input_ids
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    dev = model.device
    gen = torch.Generator(device=dev).manual_seed(seed)
    seen, out = set(), []
    while len(out) < count:
        n = min(batch, 2 * (count - len(out)))
        tables = fixed_tables(n, len(prefix) + max_len, 16, dev)  # sequence i: the blocks of row i
        cache = model.new_cache(n * tables.shape[1], 16)
        logits = torch.empty(n, model.config.vocab_size, device=dev)
        for s0 in range(0, n, 256):  # the full logits of the prefix rows are [n, len, V]: in parts
            part = tables[s0 : s0 + 256]
            logits[s0 : s0 + 256] = model(torch.tensor([prefix], device=dev).expand(len(part), -1),
                                          torch.zeros(len(part), dtype=torch.int32, device=dev), cache, part).logits[:, -1]
        turns = torch.zeros(n, max_len, dtype=torch.long, device=dev)
        for t in range(max_len):
            top = torch.topk(logits.float() / temperature, top_k, dim=-1)
            pick = top.indices.gather(1, torch.multinomial(torch.softmax(top.values, -1), 1, generator=gen))[:, 0]
            turns[:, t] = pick
            if t + 1 < max_len:
                logits = model(pick[:, None], torch.full((n,), len(prefix) + t, dtype=torch.int32, device=dev), cache,
                               tables).logits[:, 0]
        for row in turns.tolist():
            turn = row[: row.index(end)] if end in row else row
            key = tuple(turn)
            if len(turn) >= 3 and key not in seen and not set(turn) & {0, 1}:
                seen.add(key)
                out.append(prefix + turn + suffix)
    return out[:count]


def bench_prompts() -> list[str]:
    """The prompts of bench/dflash_speedup.py."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
    from dflash_speedup import PROMPTS

    return list(PROMPTS)


def chat_ids(tokenizer, prompt: str) -> list[int]:
    text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True)
    return tokenizer(text).input_ids
