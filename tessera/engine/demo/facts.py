"""What the demo model knows about Tessera, as question wordings with one fixed answer each.

The answers must stay true: they describe `tessera/app/settings.py` (the "Expert backend" setting in the Model group),
`tessera/app/paths.py` (conversations.sqlite3 in the platform's user data folder, TESSERA_DATA_DIR overriding it) and
DESIGN.md §3 (the AMX backends). Change them together with those files and retrain.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Fact:
    questions: tuple[str, ...]
    answer: str
    decorated: bool = True  # whether PREFIXES/SUFFIXES are added around the questions


# Wrapped around a question to make many wordings of it; the held-out split is over the whole wording.
PREFIXES = ("", "Hi! ", "Hello, ", "Quick question: ", "Hey. ", "Tell me: ", "Please tell me: ", "I wonder: ")
SUFFIXES = ("", " Thanks!", " Please keep it short.", " Thank you.")

FACTS: tuple[Fact, ...] = (
    Fact(
        (
            "How do I switch backends?",
            "How can I change the backend?",
            "How do I change the expert backend in Tessera?",
            "Where do I pick the CPU backend?",
            "How do I switch to another kernel backend?",
            "How do I select a different backend?",
        ),
        "Open Settings and choose one under Expert backend in the Model section. Auto picks the fastest backend your "
        "CPU supports. If a model is loaded, Tessera repacks the experts and keeps your chat.",
    ),
    Fact(
        (
            "What is AMX?",
            "What does AMX mean?",
            "Explain AMX.",
            "What is Intel AMX?",
            "What are Advanced Matrix Extensions?",
            "What is AMX used for in Tessera?",
        ),
        "AMX (Advanced Matrix Extensions) is a set of Intel CPU instructions that multiply small matrices held in "
        "tile registers. Xeon CPUs from Sapphire Rapids on have it. Tessera's AMXInt8 and AMXBF16 backends use it "
        "to run the experts.",
    ),
    Fact(
        (
            "Where are my chats stored?",
            "Where does Tessera save conversations?",
            "Where are conversations kept?",
            "Where is my chat history saved?",
            "Where does Tessera keep my chats?",
            "In which file are the chats stored?",
        ),
        "In a SQLite database, conversations.sqlite3, in Tessera's data folder (on Linux ~/.local/share/Tessera). "
        "Set TESSERA_DATA_DIR to use another folder.",
    ),
    Fact(
        (
            "What is Tessera?",
            "What does Tessera do?",
            "What is this app?",
            "Tell me about Tessera.",
            "What is Tessera for?",
        ),
        "Tessera is a desktop app for chatting with Qwen3-MoE models locally. It runs the routed experts on the CPU "
        "with kernels made for your CPU, and the rest on the GPU when there is one.",
    ),
    Fact(
        (
            "Who are you?",
            "What can you do?",
            "What are you?",
            "What model are you?",
            "What tasks can you help with?",
        ),
        "I am Tessera's demo model, a tiny Qwen3-MoE trained on generated data. I can add and subtract numbers of "
        "up to 4 digits, count letters in a word, reverse and sort short lists of numbers, and answer a few "
        "questions about Tessera.",
    ),
    Fact(
        ("Hello", "Hello!", "Hi", "Hi!", "Hi there!", "Hey", "Hey!", "Good morning!", "Good evening!", "Hello there"),
        "Hello! I am Tessera's demo model. Ask me to add or subtract numbers, count letters in a word, reverse or "
        "sort a list, or ask me about Tessera.",
        decorated=False,
    ),
)
