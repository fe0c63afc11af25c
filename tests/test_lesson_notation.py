"""One notation across the lessons: β is seconds per byte (lesson 04), so a message of S
bytes costs α + S·β and a bandwidth is 1/β.  Text that divides by β, or gives β in bytes
per second, teaches the other convention and is refused here."""
import glob
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCES = sorted(glob.glob(os.path.join(ROOT, "lessons", "sources", "l*.py")))
BETA = r"(?:\\beta|β)(?:_\{?\w+\}?)?"
WRONG = [
    (re.compile(r"(?<!1)/\s*\$?\s*" + BETA), "divides by β (a bandwidth): write S·β, or 1/β for the bandwidth"),
    (re.compile(r"(?<![/\w])" + BETA + r"\$?\s*(?:=|:)?\s*[\d.,]+\s*[kKMGT]?B/s"),
     "gives β in bytes per second: β is seconds per byte, write 1/β = ... B/s"),
    (re.compile(r"f\"(?:[^\"]*\s)?" + BETA + r"\s*\{[^}]*1\s*/"), "prints 1/β labelled β"),
]


def test_there_are_lessons_to_check():
    assert len(SOURCES) >= 16


@pytest.mark.parametrize("path", SOURCES, ids=os.path.basename)
def test_beta_is_seconds_per_byte(path):
    text = open(path, encoding="utf-8").read()
    found = [(text.count("\n", 0, m.start()) + 1, why) for rule, why in WRONG for m in rule.finditer(text)]
    assert not found, f"{os.path.basename(path)}: " + "; ".join(f"line {n}: {why}" for n, why in found)


@pytest.mark.parametrize("line,bad", [
    ("a message costs $\\alpha + S/\\beta$", True), ("the bucket takes S/β on the wire", True),
    ("($\\beta$ = 50 MB/s)", True), ('f"β {1 / x.beta / 1e9} GB/s"', True),
    ("a message costs $\\alpha + S\\beta$", False), ("($1/\\beta$ = 50 MB/s)", False),
    ('f"1/β {1 / x.beta / 1e9} GB/s"', False), ("LayerNorm: γ = 1, β = 0 at init", False)])
def test_the_rules_catch_the_other_convention(line, bad):
    assert any(rule.search(line) for rule, _ in WRONG) == bad, line
