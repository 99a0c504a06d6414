"""The DFlash evaluation set: general prompts written for evaluation alone, never used in training.

Each entry is {"id", "kind", "mode", "prompt"}:
  kind: code, math, lists (lists and tables), prose (long-form writing), rewrite
        (rewriting and summarising), multilingual, structured (JSON, YAML, CSV, XML),
        everyday (facts, recipes, letters, advice: what a new user asks first);
  mode: "chat" (a user turn, sent through the chat template) or "raw" (a completion
        prompt, sent as it is);
  long: True where the prompt carries a long context (a passage, a document, code).

tests/dflash/test_eval_prompts.py checks that no prompt here is, exactly or nearly, one
that scripts/train_dflash.py trains on (template, extra and general prompts, and the
text files its raw completions are cut from). Keep it that way: write new prompts here,
never derive them from scripts/dflash_prompts.py.
"""
from __future__ import annotations

# ---- long passages, written for this set ------------------------------------------------

_HARBOR = """The town of Marrow Point grew up around a harbor that freezes for four months of the year. In the early years the families who settled there fished for cod in the summer and cut ice in the winter, packing it in sawdust and shipping it south on the first boats of spring. When refrigeration arrived in the 1920s the ice trade collapsed almost overnight, and half of the town's young people left for the mills along the river. Those who stayed turned to boat building. By 1950 the yard at the north end of the harbor employed two hundred people and launched a new trawler every six weeks. The yard closed in 1987 after a long dispute over wages, and for a decade the town seemed to be fading away. What saved it, oddly, was the cold. A group of retired teachers began renting out the old ice houses to visitors who wanted to see the frozen harbor, and a winter festival with sled races and lantern walks now brings in more money each February than the fishing fleet earns in a year. The town council is now debating whether to allow a large hotel on the site of the old yard. Supporters say it would bring jobs that last all year; opponents worry that it would change the character of a place that survived precisely because it stayed small."""

_CLINIC = """Meeting notes, Riverside Community Clinic, staff meeting, Tuesday.
Present: Dr. Amara Osei (chair), Lena Brandt (nursing), Tom Reyes (front desk), Priya Nair (pharmacy), Sam Whitfield (IT).
1. Waiting times. Tom reported that the average wait on Monday mornings has reached 52 minutes, up from 35 in the spring. Most of the delay comes from walk-in patients who arrive before 9:00. Lena suggested opening a second triage desk from 8:30 to 10:30 on Mondays. Dr. Osei agreed to try it for six weeks and to review the numbers at the end.
2. Pharmacy stock. Priya said the clinic ran out of the children's fever syrup twice last month because the supplier changed its delivery day from Thursday to Friday. She will move the weekly order forward by one day and keep a safety stock of twenty bottles.
3. Computers. Sam explained that the booking system will be updated on the 14th. The update takes about three hours and the system will be offline from 6:00 to 9:00. Paper forms will be used for the first appointments that day, and Tom will enter them into the system afterwards.
4. Training. Two new nurses start next month. Lena will prepare a one-week introduction, including a day shadowing the front desk.
Action items: Lena to set up the second triage desk; Priya to change the pharmacy order; Sam to send a reminder about the update one week before; Tom to print the paper forms."""

_CODE_INVENTORY = '''class Inventory:
    def __init__(self):
        self.items = {}

    def add(self, name, qty, price):
        if name in self.items:
            old_qty, old_price = self.items[name]
            self.items[name] = (old_qty + qty, price)
        else:
            self.items[name] = (qty, price)

    def remove(self, name, qty):
        current, price = self.items[name]
        if qty > current:
            raise ValueError("not enough stock")
        self.items[name] = (current - qty, price)

    def total_value(self):
        total = 0
        for name in self.items:
            qty, price = self.items[name]
            total = total + qty * price
        return total

    def low_stock(self, limit):
        result = []
        for name, (qty, price) in self.items.items():
            if qty < limit:
                result.append(name)
        return result
'''

_ESSAY_DRAFT = """Many people think that working from home is always easier than going to an office, but my experience has been more mixed. When I first started, I loved not having to commute. I saved almost an hour each day and I could start work in comfortable clothes. However, after a few months I noticed that the days began to blur together. There was no clear line between work and the rest of my life, so I often kept answering messages late into the evening. I also missed the small conversations with colleagues that used to happen by the coffee machine, which were often where good ideas came from. To deal with this, I set fixed hours, I go for a walk at the end of every workday as a kind of fake commute, and I meet a coworker for lunch once a week. These habits have helped a lot, although I still think a mix of home and office days would suit me best."""

_RECIPE_TEXT = """Grandma Ilse's plum cake (makes one tray)
Ingredients: 500 g flour, 1 packet dry yeast, 250 ml warm milk, 80 g sugar, 80 g soft butter, 1 egg, a pinch of salt, 1.5 kg ripe plums, cinnamon sugar for the top.
Method: Mix the yeast with a spoonful of sugar and the warm milk and leave it for ten minutes until it foams. Put the flour in a large bowl, add the rest of the sugar, the salt, the egg, the butter and the yeast milk, and knead for about eight minutes until the dough is smooth and no longer sticks to your hands. Cover the bowl and let the dough rise in a warm place for an hour. Meanwhile wash the plums, cut them open along one side and remove the stones without cutting them in half. Roll the dough out on a greased baking tray and press it gently into the corners. Lay the plums on the dough in tight rows, skin side down, so that they stand up a little. Let the cake rise for another twenty minutes, then bake at 180 degrees for 35 to 40 minutes. Sprinkle with cinnamon sugar while it is still warm and serve with whipped cream."""

_LOG_LINES = """2024-03-02 10:14:03 INFO  api    request id=7f3a path=/orders user=1182 status=200 ms=41
2024-03-02 10:14:05 INFO  api    request id=7f3b path=/orders/991 user=1182 status=200 ms=38
2024-03-02 10:14:09 WARN  db     slow query table=orders ms=1840
2024-03-02 10:14:09 INFO  api    request id=7f3c path=/orders user=2204 status=200 ms=1902
2024-03-02 10:14:12 ERROR api    request id=7f3d path=/payments user=2204 status=502 ms=3001 error="upstream timeout"
2024-03-02 10:14:13 INFO  api    request id=7f3e path=/health status=200 ms=2
2024-03-02 10:14:20 ERROR api    request id=7f3f path=/payments user=3310 status=502 ms=3002 error="upstream timeout"
2024-03-02 10:14:31 WARN  db     connection pool exhausted size=20 waiting=7
2024-03-02 10:14:32 INFO  api    request id=7f40 path=/orders user=3310 status=200 ms=655"""

EVAL_PROMPTS: list[dict] = []


def _add(kind: str, mode: str, prompt: str, long: bool = False) -> None:
    EVAL_PROMPTS.append({"id": f"{kind}-{sum(p['kind'] == kind for p in EVAL_PROMPTS):02d}", "kind": kind,
                         "mode": mode, "long": long, "prompt": prompt})


# ---- code ---------------------------------------------------------------------------------
for p in [
    "Write a Python function `chunk_text(text, width)` that splits a paragraph into lines no longer than `width` characters without breaking words.",
    "In Go, write a small HTTP handler that returns the current server time as JSON.",
    "Write a Rust program that reads numbers from standard input, one per line, and prints their running total.",
    "Show me a TypeScript interface for a blog post with a title, an author, tags and a publication date, and a function that sorts posts by date.",
    "Write a bash script that renames every .jpeg file in the current folder to .jpg.",
    "Write a SQL query that finds, for each department, the employee with the highest salary. The tables are employees(id, name, salary, dept_id) and departments(id, name).",
    "Explain what a Python decorator is and write one that times how long a function takes.",
    "Write a Java class `BankAccount` with deposit, withdraw and balance methods; withdraw should refuse to go below zero.",
    "How do I read a JSON file in Node.js and print one of its fields? Give a short example.",
    "Write a C++ function that returns the k largest elements of a vector, using a priority queue.",
    "Here is a Python class. Review it and suggest three improvements, then show the improved version.\n\n" + _CODE_INVENTORY,
]:
    _add("code", "chat", p, long="class Inventory" in p)
for p in [
    "def celsius_to_kelvin(c):\n    \"\"\"Convert a temperature in degrees Celsius to kelvin.\"\"\"\n",
    "// Returns true if the array contains any value twice.\nfunction hasDuplicate(values) {\n",
    "#include <stdio.h>\n\n/* Print the multiplication table from 1 to 9. */\nint main(void) {\n",
    _CODE_INVENTORY + "\n\nif __name__ == \"__main__\":\n    inv = Inventory()\n",
]:
    _add("code", "raw", p, long="class Inventory" in p)

# ---- math and reasoning ----------------------------------------------------------------------
for p in [
    "A shop sells pencils at 3 for 75 cents. How much do 14 pencils cost? Show each step.",
    "Solve the system of equations 2x + 3y = 12 and x - y = 1.",
    "What is the derivative of x^3 * sin(x)? Explain the rule you use.",
    "A bag has 5 red, 3 blue and 2 green marbles. If I draw two without replacement, what is the probability both are red?",
    "If a car uses 6.5 litres of fuel per 100 km, how much fuel does a 340 km trip need?",
    "Tom is older than Ana. Ana is older than Lee. Is Lee older than Tom? Explain your reasoning.",
    "Prove that the sum of two odd numbers is always even.",
    "Convert 0.375 to a fraction in lowest terms and explain how.",
    "A rectangle has a perimeter of 46 cm and one side of 9 cm. What is its area?",
    "Three friends split a restaurant bill of $87.60 and want to leave a 15% tip. How much does each person pay?",
    "What is the sum of the integers from 1 to 250? Explain the trick.",
]:
    _add("math", "chat", p)
for p in [
    "Problem: A tank holds 1200 litres and drains at 40 litres per minute. How long until it is empty?\nSolution: ",
    "Q: What is 15% of 240?\nA: 10% of 240 is 24, and 5% is half of that, 12. So 15% is",
    "Step-by-step solution of 3(x - 4) = 2x + 5:\n1.",
    "The area of a circle with radius r is pi r^2. For a circle of diameter 10 cm, the radius is 5 cm, so the area is",
]:
    _add("math", "raw", p)

# ---- lists and tables ----------------------------------------------------------------------
for p in [
    "Make a packing checklist for a three-day business trip.",
    "Create a markdown table of the planets of the solar system with their order from the sun and whether they have rings.",
    "List eight common kitchen herbs and one dish each is used in.",
    "Give me a weekly cleaning schedule as a table with days as rows.",
    "What are the steps to set up a new Git repository and push it to a remote? Number them.",
    "Make a table comparing trains, buses and planes on cost, speed and comfort.",
    "List ten verbs that are irregular in English, with their past tense and past participle.",
    "Give me a bulleted list of questions to ask a landlord before renting an apartment.",
    "Create a simple study timetable for a student with exams in math, biology and history in two weeks.",
    "List the months of the year with the number of days in each.",
    "Summarize the meeting notes below as a table of action items with columns Owner and Task.\n\n" + _CLINIC,
]:
    _add("lists", "chat", p, long=p.endswith(_CLINIC))
for p in [
    "Shopping list for the week:\n- eggs\n- milk\n-",
    "| Country | Capital | Continent |\n|---|---|---|\n| Kenya | Nairobi | Africa |\n| Chile |",
    "Top 10 tips for new gardeners\n\n1. Start small.\n2.",
    "Ingredients\n\n* 2 cups of rice\n* 1 onion, chopped\n*",
]:
    _add("lists", "raw", p)

# ---- long-form prose ------------------------------------------------------------------------
for p in [
    "Write a 400-word essay on why public libraries still matter in the age of the internet.",
    "Write the opening chapter of a mystery novel set on a night train across the mountains.",
    "Write a detailed blog post about learning to cook as an adult, with an introduction, three sections and a conclusion.",
    "Write a long letter from a grandmother to her grandson who is about to leave for university.",
    "Describe, in several paragraphs, how a small bakery prepares for the day between 3 and 7 in the morning.",
    "Write a short science fiction story in which the last bookshop on Mars has to close.",
    "Write a persuasive op-ed arguing that cities should plant more trees on their streets.",
    "Write a travel diary entry of a day spent walking through an old port city.",
    "Write a speech that a school principal gives at the end of the year.",
    "Continue this story in several paragraphs: The lights in the village went out at exactly midnight, and nobody knew why.",
    "Here is the history of a small town. Write a feature article for a travel magazine based on it.\n\n" + _HARBOR,
]:
    _add("prose", "chat", p, long=p.endswith(_HARBOR))
for p in [
    "Chapter One\n\nThe rain had not stopped for three days when Mira finally decided to open the letter.",
    "It was the kind of summer afternoon when the whole street seemed to be asleep. Down at the corner, the old ice cream van",
    "Dear diary,\n\nToday was my first day at the new school and",
    _HARBOR + "\n\nLooking back, the people of Marrow Point",
]:
    _add("prose", "raw", p, long=p.startswith(_HARBOR))

# ---- rewriting and summarising ----------------------------------------------------------------
for p in [
    "Rewrite this sentence so it sounds more polite: Send me the report by tomorrow or I will escalate.",
    "Fix the grammar and spelling: their going to the libary tomorow becuase they has a test on monday.",
    "Summarize in one sentence: The committee met for three hours and, after a long debate about the budget, decided to postpone the new playground until next spring while repairing the old swings now.",
    "Make this paragraph more formal: Hey all, the printer's broken again so please don't use it till the tech guy comes by on Friday.",
    "Rewrite the following for a ten-year-old: Photosynthesis converts light energy into chemical energy stored in glucose molecules.",
    "Paraphrase: The early bird catches the worm.",
    "Shorten this text to about half its length while keeping the main points.\n\n" + _ESSAY_DRAFT,
    "Summarize the following meeting notes in three bullet points.\n\n" + _CLINIC,
    "Summarize this article in one paragraph.\n\n" + _HARBOR,
    "Rewrite this recipe as a numbered list of short steps.\n\n" + _RECIPE_TEXT,
    "Turn these server logs into a short incident summary for a manager who is not technical.\n\n" + _LOG_LINES,
]:
    _add("rewrite", "chat", p, long=len(p) > 600)
for p in [
    "Original: the meeting is moved to thursday cause the room is booked\nCorrected: ",
    _ESSAY_DRAFT + "\n\nTL;DR:",
    "Informal: gonna be late, traffic is crazy, start without me\nFormal:",
    _RECIPE_TEXT + "\n\nIn short, to make this cake you",
]:
    _add("rewrite", "raw", p, long=len(p) > 600)

# ---- multilingual ---------------------------------------------------------------------------
for p in [
    "Translate into French: The museum is closed on Mondays, but the garden stays open until sunset.",
    "¿Cuáles son tres consejos para dormir mejor por la noche?",
    "Übersetze ins Englische: Wir haben den Zug verpasst und mussten zwei Stunden am Bahnhof warten.",
    "Écris un court message pour souhaiter un bon anniversaire à une collègue.",
    "Translate this into Spanish: Could you tell me where the nearest pharmacy is?",
    "Quali sono i monumenti più famosi di Roma? Rispondi in italiano.",
    "Explique en français la différence entre la météo et le climat.",
    "Translate into German: Please remember to turn off the lights when you leave the office.",
    "Escreva uma frase simples em português sobre o mar.",
    "What does the Japanese word 'arigatou' mean, and when do people use it?",
    "Translate the following paragraph into French.\n\n" + _ESSAY_DRAFT,
]:
    _add("multilingual", "chat", p, long=p.endswith(_ESSAY_DRAFT))
for p in [
    "English: Good morning, how are you?\nFrench: Bonjour, comment allez-vous ?\nEnglish: Where is the train station?\nFrench:",
    "Receta de tortilla de patatas\n\nIngredientes: cuatro huevos, tres patatas, media cebolla y aceite de oliva.\n\nPreparación:",
    "Es war einmal ein kleiner Fuchs, der im Wald lebte. Jeden Morgen",
    "Liste des courses :\n- pain\n- fromage\n-",
]:
    _add("multilingual", "raw", p)

# ---- structured output ------------------------------------------------------------------------
for p in [
    "Return a JSON object describing a book with the fields title, author, year, genres (a list) and available (a boolean).",
    "Extract the people and their roles from this text as a JSON list of objects with name and role: Maria chairs the board, Kenji is the treasurer and Aisha keeps the minutes.",
    "Write a YAML configuration for a web service with a port, a log level, and a list of two database replicas.",
    "Give me a CSV with five rows of sample product data: id, name, price, in_stock.",
    "Convert this into JSON: name Ana Lopez, age 34, city Lisbon, languages Portuguese and English.",
    "Write a JSON schema for a user with a required email string and an optional age integer.",
    "Produce an XML document for a small library catalogue with two books.",
    "Create a JSON array of three quiz questions, each with a question, four options and the index of the correct answer.",
    "Output the following as a JSON object with keys date, amount and description: On 4 March I paid 23.50 euros for train tickets.",
    "Write a package.json for a small Node.js project called weather-cli with one dependency, axios.",
    "Read these server logs and output a JSON list of the errors with fields time, path and error.\n\n" + _LOG_LINES,
]:
    _add("structured", "chat", p, long=p.endswith(_LOG_LINES))
for p in [
    '{\n  "name": "Riverside Community Clinic",\n  "address": {\n    "street":',
    '[\n  {"id": 1, "city": "Oslo", "temperature": -3},\n  {"id": 2, "city": "Madrid", "temperature": 14},\n  {"id": 3,',
    "server:\n  host: 0.0.0.0\n  port: 8080\ndatabase:\n",
    "id,name,department,start_date\n1,Alice Moreau,Sales,2021-04-12\n2,",
]:
    _add("structured", "raw", p)

# ---- everyday requests --------------------------------------------------------------------------
for p in [
    "How long should I boil an egg for a soft yolk?",
    "Write a short thank-you email to a neighbor who watered my plants while I was away.",
    "What is the tallest mountain in Africa?",
    "Give me a simple recipe for pancakes.",
    "How do I get a red wine stain out of a white shirt?",
    "Write a birthday card message for my dad who loves fishing.",
    "What is the difference between a crocodile and an alligator?",
    "Can you suggest a name for a small coffee shop near a university?",
    "Who invented the light bulb?",
    "What should I do if my laptop battery drains very quickly?",
    "Based on the recipe below, what can I use instead of fresh yeast, and how long does the cake take in total?\n\n" + _RECIPE_TEXT,
]:
    _add("everyday", "chat", p, long=p.endswith(_RECIPE_TEXT))
for p in [
    "Dear Mr. Patel,\n\nThank you for your letter of 12 May. I am writing to",
    "Frequently asked questions\n\nQ: How do I reset my password?\nA:",
    "The capital of Australia is",
    "To make a good cup of coffee at home, you need",
]:
    _add("everyday", "raw", p)


KINDS = ("code", "math", "lists", "prose", "rewrite", "multilingual", "structured", "everyday")


def eval_prompts(kinds: tuple[str, ...] | None = None) -> list[dict]:
    """The set (every kind by default), in a fixed order."""
    return [p for p in EVAL_PROMPTS if kinds is None or p["kind"] in kinds]


def render(tokenizer, entry: dict) -> str:
    """The text sent to the engine: a chat prompt through the tokenizer's chat template, a
    raw one as it is."""
    if entry["mode"] == "raw":
        return entry["prompt"]
    return tokenizer.apply_chat_template([{"role": "user", "content": entry["prompt"]}], tokenize=False,
                                         add_generation_prompt=True)
