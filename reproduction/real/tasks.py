"""Five chat tasks for SmolLM2-135M-Instruct, modelled on the paper's agent domains (code, tool use, memory),
with arithmetic word problems and retrieval over a passage added for issue 38's regime runs (4–5 agents).

Each example is ``{"prompt": str, "answer": str}`` (the user turn; the task's short system prompt is in
``SYSTEM``), seeded and disjoint by split: validation and test never repeat a train prompt, nor each other.
The answer formats are ones a 135M chat model can hit (a number, one call), and the rewards in ``reward.py``
give partial credit, so that the base scores between 10 % and 60 % and GRPO's groups of samples differ.
"""

from __future__ import annotations

import random

TASKS = ("code", "tool", "memory", "arith", "retrieval")
FIRST_TASKS = ("code", "tool", "memory")  # the three tasks of the first H100 run (results before issue 38)
SPLITS = ("train", "validation", "test")

SYSTEM = {
    "code": "You are a Python interpreter. Reply with the printed output only.",
    "tool": "Pick the tool for the request and reply as tool(argument). Tools: weather, search, timer, email.",
    "memory": "Answer with the number only.",
    "arith": "Solve the problem. Reply with the number only.",
    "retrieval": "Answer with the name only.",
}
# greedy completions are cut here: the answer fits, a verbose reply is scored on its start
MAX_NEW_TOKENS = {"code": 12, "tool": 16, "memory": 10, "arith": 10, "retrieval": 8}

CITIES = [
    "Paris",
    "Oslo",
    "Rome",
    "Lima",
    "Kyiv",
    "Cairo",
    "Tokyo",
    "Berlin",
    "Madrid",
    "Dublin",
    "Vienna",
    "Prague",
    "Lisbon",
    "Athens",
    "Seoul",
    "Delhi",
    "Boston",
    "Denver",
    "Sydney",
    "Toronto",
    "Nairobi",
    "Lagos",
    "Quito",
    "Hanoi",
    "Manila",
    "Dakar",
    "Tunis",
    "Zurich",
    "Munich",
    "Milan",
    "Naples",
    "Warsaw",
    "Riga",
    "Tallinn",
    "Helsinki",
    "Bergen",
    "Porto",
    "Seville",
    "Geneva",
    "Kyoto",
]
TOPICS = [
    "jazz",
    "tea",
    "rust",
    "chess",
    "whales",
    "volcanoes",
    "tulips",
    "comets",
    "pasta",
    "robots",
    "castles",
    "owls",
    "glaciers",
    "bees",
    "saturn",
    "origami",
    "pottery",
    "sharks",
    "deserts",
    "rainbows",
    "pyramids",
    "dolphins",
    "mushrooms",
    "tornadoes",
    "violins",
    "bridges",
    "penguins",
    "coral",
    "lighthouses",
    "bamboo",
]
NAMES = [
    "Anna",
    "Bob",
    "Eve",
    "Lee",
    "Tom",
    "Maria",
    "Omar",
    "Yuki",
    "Ines",
    "Raj",
    "Lena",
    "Paul",
    "Nina",
    "Sam",
    "Ivan",
    "Chen",
    "Sara",
    "Leo",
    "Mia",
    "Ali",
]
WEATHER = (
    "What is the weather in {}?",
    "Is it raining in {} today?",
    "How warm is it in {} right now?",
    "Tell me the forecast for {}.",
    "Do I need an umbrella in {}?",
)
SEARCH = (
    "Find information about {}.",
    "Look up {} for me.",
    "I want to learn about {}.",
    "Search the web for {}.",
    "What is known about {}?",
)
TIMER = ("Set a timer for {} minutes.", "Remind me in {} minutes.", "Start a {} minute countdown.")
EMAIL = ("Send an email to {}.", "Write an email to {}.", "Email {} please.")
COLORS = ["red", "blue", "green", "yellow", "black", "white", "pink", "brown", "gray", "orange", "purple", "silver"]
THINGS = ["box", "jar", "bag", "cup", "tin", "bowl"]


def code_example(rng: random.Random) -> dict:
    """A three-line program and its printed value: ``a = 4 / b = a * 3 / print(b + 2)`` -> ``14``."""
    a, k, d = rng.randint(2, 9), rng.randint(2, 5), rng.randint(1, 9)
    op1, op2 = rng.choice("+*"), rng.choice("+-")
    b = a + k if op1 == "+" else a * k
    result = b + d if op2 == "+" else b - d
    return {"prompt": f"a = {a}\nb = a {op1} {k}\nprint(b {op2} {d})", "answer": str(result)}


def tool_example(rng: random.Random) -> dict:
    """A request and the one call that serves it: ``How warm is it in Oslo?`` -> ``weather(Oslo)``."""
    tool = rng.choice(("weather", "search", "timer", "email"))
    if tool == "weather":
        arg, text = rng.choice(CITIES), rng.choice(WEATHER)
    elif tool == "search":
        arg, text = rng.choice(TOPICS), rng.choice(SEARCH)
    elif tool == "timer":
        arg, text = str(rng.randint(2, 120)), rng.choice(TIMER)
    else:
        arg, text = rng.choice(NAMES), rng.choice(EMAIL)
    return {"prompt": text.format(arg), "answer": f"{tool}({arg})"}


def memory_example(rng: random.Random) -> dict:
    """Recall one number from a list of facts: ``The red box holds 42. ... What does the blue box hold?``."""
    thing = rng.choice(THINGS)
    colors = rng.sample(COLORS, 6)
    values = rng.sample(range(10, 100), len(colors))
    facts = " ".join(f"The {c} {thing} holds {v}." for c, v in zip(colors, values))
    i = rng.randrange(len(colors))
    return {"prompt": f"{facts}\nWhich number does the {colors[i]} {thing} hold?", "answer": str(values[i])}


PLACES = ["bakery", "bank", "school", "library", "museum", "harbour", "hospital", "theatre", "garage", "market"]
FRUITS = ["apples", "pears", "plums", "lemons", "eggs", "cards", "stamps", "books", "coins", "shells"]


def arith_example(rng: random.Random) -> dict:
    """A two-step word problem: ``Anna has 7 apples. She buys 5 more and gives 3 away. ...`` -> ``9``."""
    name, thing = rng.choice(NAMES), rng.choice(FRUITS)
    a, b = rng.randint(3, 20), rng.randint(2, 15)
    c = rng.randint(1, a + b - 1)
    if rng.random() < 0.5:
        text = f"{name} has {a} {thing}. {name} gets {b} more and then gives {c} away."
        result = a + b - c
    else:
        k = rng.randint(2, 4)
        text = f"{name} has {a} {thing}. {name} gets {k} times as many again and then gives {c} away."
        result = a + k * a - c
    return {"prompt": f"{text} How many {thing} does {name} have now?", "answer": str(result)}


def retrieval_example(rng: random.Random) -> dict:
    """Find one fact in a passage: ``Anna works at the bank. Omar works at the school. ... Who works at the
    school?`` -> ``Omar``."""
    people = rng.sample(NAMES, 5)
    places = rng.sample(PLACES, 5)
    passage = " ".join(f"{n} works at the {p}." for n, p in zip(people, places))
    i = rng.randrange(5)
    return {"prompt": f"{passage}\nWho works at the {places[i]}?", "answer": people[i]}


GENERATORS = {
    "code": code_example,
    "tool": tool_example,
    "memory": memory_example,
    "arith": arith_example,
    "retrieval": retrieval_example,
}


def make_splits(task: str, sizes: dict[str, int], seed: int) -> dict[str, list[dict]]:
    """``sizes[split]`` examples of ``task`` per split, no prompt in two splits, none twice in one."""
    rng = random.Random(f"real-{seed}-{task}")
    seen: set[str] = set()
    out: dict[str, list[dict]] = {}
    for split in SPLITS:  # train first, so a small train split still keeps its prompts out of the others
        rows: list[dict] = []
        tries = 0
        while len(rows) < sizes.get(split, 0) and tries < 200 * max(sizes.get(split, 0), 1):
            tries += 1
            example = GENERATORS[task](rng)
            if example["prompt"] in seen:
                continue
            seen.add(example["prompt"])
            rows.append(example)
        out[split] = rows
    return out
