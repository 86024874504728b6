"""Training prompts for an assistant's drafters, made for the purpose and kept apart from every benchmark.

Each prompt is one of a set of request forms (the kinds a chat suite holds: advice, explanation,
code, arithmetic, summaries, extraction, translation, stories, careful answers) filled from topic
lists written here, with a seeded generator: a drafter learns how the target answers such requests
without seeing a prompt a suite measures. The forms and topics were written for this file, not
taken from a dataset: none is a prompt of specbench's suites, AlpacaEval, MT-bench or Spec-Bench,
and `overlapping` checks the word n-grams against the suites specbench ships.
"""

from __future__ import annotations

import random
import re
from typing import Iterable

HOBBIES = ["bird watching", "pottery", "rock climbing", "chess", "sourdough baking", "sketching", "kayaking",
           "beekeeping", "origami", "amateur astronomy", "woodcarving", "knitting", "trail running", "calligraphy"]
SUBJECTS = ["tides", "volcanoes", "rainbows", "glaciers", "photosynthesis", "vaccines", "magnets", "echoes",
            "compound interest", "inflation", "black holes", "earthquakes", "fermentation", "solar panels",
            "the water cycle", "antibiotics", "jet engines", "coral bleaching", "bread rising", "thunder",
            "the seasons", "ocean currents", "muscle growth", "dreams", "recycling plastics", "wind turbines"]
AUDIENCES = ["a child of eight", "a high-school student", "a busy manager", "someone new to the topic", "a grandparent"]
THINGS = ["a used car", "a laptop for university", "running shoes", "a tent", "a houseplant", "a sofa",
          "a first guitar", "a kitchen knife", "a winter coat", "a camera for travel", "a desk chair"]
SITUATIONS = ["prepare for a job interview", "sleep better during exam weeks", "keep a small garden alive in summer",
              "save money on groceries", "start running at forty", "learn a language in the evenings",
              "plan a birthday party on a budget", "organise a shared kitchen", "stop procrastinating on chores",
              "get ready for a long train journey", "welcome a new cat at home", "keep focus when working remotely"]
TASKS = ["reverses the words of a sentence", "counts the vowels in a string", "returns the largest of three numbers",
         "checks whether a year is a leap year", "removes duplicates from a list while keeping order",
         "converts Celsius to Fahrenheit", "tells whether a word is a palindrome", "sums the digits of an integer",
         "finds the second smallest value in a list", "formats seconds as hours, minutes and seconds",
         "groups words by their first letter", "returns the factorial of n"]
LANGUAGES = ["Python", "JavaScript", "Go", "Java", "C"]
SPOKEN = ["Spanish", "German", "Portuguese", "French", "Italian"]
NAMES = ["Lena", "Tomas", "Priya", "Kwame", "Sofia", "Marek", "Yuki", "Olu", "Ines", "Dmitri"]
PLACES = ["a mountain village", "a night market", "an old library", "a harbour at dawn", "a desert train station",
          "a snowed-in cabin", "a rooftop garden", "a ferry in fog"]
OBJECTS = ["a brass key", "a torn map", "a music box", "a red umbrella", "an unsent postcard", "a pocket watch"]
FIELDS = ["first aid", "food safety", "tax filing", "electrical wiring at home", "medication storage",
          "rental agreements", "password security", "child car seats"]
PASSAGE_FACTS = [
    ("The new footbridge", "links the two halves of the park", "cost 2.4 million", "opened after eighteen months"),
    ("The village bakery", "now opens at six", "hired three apprentices", "sells rye bread made with local flour"),
    ("The river clean-up", "removed 900 kilograms of rubbish", "drew 150 volunteers", "will be repeated each spring"),
    ("The school orchestra", "played its first concert abroad", "raised money with a bake sale",
     "travelled by overnight coach"),
    ("The city library", "extended its evening hours", "added a repair cafe", "lends tools as well as books"),
]


STYLES = ["", " Keep the answer brief.", " Use plain words.", " Answer in a friendly tone.", " Be precise.",
          " Number the main points."]


def _passage(rng: random.Random) -> str:
    subject, *facts = rng.choice(PASSAGE_FACTS)
    name, other = rng.sample(NAMES, 2)
    rng.shuffle(facts)
    return (f"{subject} {facts[0]}. According to {name}, who led the project, it {facts[1]}. "
            f"{other} said the team {facts[2]} and hopes others will follow.")


FORMS = [
    lambda r: f"Explain the science behind {r.choice(SUBJECTS)} to {r.choice(AUDIENCES)}.",
    lambda r: f"Give me five practical tips to {r.choice(SITUATIONS)}.",
    lambda r: f"What should I look for when choosing {r.choice(THINGS)}? Keep it short.",
    lambda r: f"I want to take up {r.choice(HOBBIES)}. How should I begin, and what does it cost?",
    lambda r: f"Write a {r.choice(LANGUAGES)} function that {r.choice(TASKS)}, with a short explanation.",
    lambda r: (f"A shop sells pens at {r.randint(2, 9)} euros each and notebooks at {r.randint(3, 15)} euros. "
               f"How much do {r.randint(2, 12)} pens and {r.randint(2, 8)} notebooks cost? Show each step."),
    lambda r: f"What is {r.randint(11, 99)} multiplied by {r.randint(11, 99)}? Work it out step by step.",
    lambda r: f"Summarise in one sentence:\n\n{_passage(r)}",
    lambda r: f"Who is named in this text, and what did each of them say? Answer as a list.\n\n{_passage(r)}",
    lambda r: f"Translate into {r.choice(SPOKEN)}: \"{_passage(r).split('. ')[0]}.\"",
    lambda r: f"Write a short story of about 120 words set in {r.choice(PLACES)}, where {r.choice(NAMES)} "
              f"finds {r.choice(OBJECTS)}.",
    lambda r: f"Write a four-line poem about {r.choice(SUBJECTS)}.",
    lambda r: f"What are the most common mistakes people make with {r.choice(FIELDS)}, and how are they avoided?",
    lambda r: f"Compare {r.choice(HOBBIES)} and {r.choice(HOBBIES)} as ways to relax after work.",
    lambda r: f"Why do people disagree about {r.choice(SUBJECTS)}? Describe two points of view.",
    lambda r: f"My friend {r.choice(NAMES)} wants to {r.choice(SITUATIONS)}. Write a kind, encouraging message.",
]


# tasks over a passage the target wrote itself (training/corpus.py): answers that copy from their prompt
PASSAGE_TASKS = [
    lambda r, p: f"Summarise this text in two sentences.\n\n{p}",
    lambda r, p: f"Rewrite the following in plain, simple words.\n\n{p}",
    lambda r, p: f"List the main points of this text as bullet points.\n\n{p}",
    lambda r, p: f"Translate into {r.choice(SPOKEN)}:\n\n\"{' '.join(_sentences(p)[:2])}\"",
    lambda r, p: f"Extract the key facts of this text as a JSON object with the keys \"topic\" and \"facts\".\n\n{p}",
    lambda r, p: f"Correct any mistakes in this text and give the corrected version.\n\n{p}",
    lambda r, p: f"Give this text a title and a one-sentence summary.\n\n{p}",
    lambda r, p: f"Who would find this text useful, and why? Quote the sentence that matters most.\n\n{p}",
]


def _sentences(text: str) -> list[str]:
    return re.findall(r"[^.!?]+[.!?]", text)


def passage(text: str, min_words: int = 25) -> str:
    """An answer cut after its last whole sentence, as a passage to work on; empty where too short."""
    kept = "".join(_sentences(text.strip())).strip()
    return kept if len(kept.split()) >= min_words else ""


def passage_prompts(passages: list[str], count: int, seed: int = 0) -> list[str]:
    """`count` tasks (fewer where there are fewer passages), each over its own passage, the tasks in turn."""
    rng = random.Random(seed)
    chosen = rng.sample(passages, min(count, len(passages)))
    return [PASSAGE_TASKS[i % len(PASSAGE_TASKS)](rng, text) for i, text in enumerate(chosen)]


def chat_prompts(count: int, seed: int = 0) -> list[list[str]]:
    """`count` distinct single-turn prompts (fewer past the forms' thousands of fillings), the forms in turn,
    filled by a generator seeded with `seed`."""
    rng = random.Random(seed)
    prompts: dict[str, None] = {}  # insertion-ordered set
    for _ in range(100 * count):
        if len(prompts) == count:
            break
        prompts[FORMS[len(prompts) % len(FORMS)](rng) + rng.choice(STYLES)] = None
    return [[p] for p in prompts]


# a prompt sharing this many words in a row with a suite's turn is taken as copied from it: the held-out
# Spec-Bench passages share 6-word phrases of everyday English ("can you provide a python solution") with
# requests never copied from them; 8 words find none of those in the shipped corpus and still find a copy
LEAK_WORDS = 8


def word_sequences(texts: Iterable[str], n: int = LEAK_WORDS) -> frozenset[tuple[str, ...]]:
    """Every n-word sequence of `texts` (lower-cased words), to check many prompts against at once."""
    return frozenset().union(*(_ngrams(t, n) for t in texts))


def _ngrams(text: str, n: int) -> set[tuple[str, ...]]:
    words = re.findall(r"[a-z0-9]+", text.lower())
    return {tuple(words[i:i + n]) for i in range(len(words) - n + 1)}


def overlapping(prompts: Iterable[list[str]], suite_texts: Iterable[str] | frozenset, n: int = LEAK_WORDS) -> list[str]:
    """The prompts whose turns share an n-word sequence with any of `suite_texts` (or with the sequences
    `word_sequences` made of them): the suites must not leak into training."""
    measured = suite_texts if isinstance(suite_texts, frozenset) else word_sequences(suite_texts, n)
    return [turns[0] for turns in prompts if any(_ngrams(turn, n) & measured for turn in turns)]
