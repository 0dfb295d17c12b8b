"""The README's and docs/'s links within the repository lead somewhere: each file exists, and each #anchor is a
heading of its file as GitHub names it (two links to the results page had lost a heading's date)."""
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = ["README.md"] + sorted(os.path.join("docs", f) for f in os.listdir(os.path.join(ROOT, "docs"))
                               if f.endswith(".md"))
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchor(heading):
    """GitHub's anchor of a heading: lower case, punctuation dropped (letters of any script, digits, '-' and '_'
    kept), each space a '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path):
    """The anchors of a Markdown file's headings (outside code blocks), a repeated one numbered as GitHub does."""
    found, fenced = set(), False
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        for line in f:
            if line.startswith("```"):
                fenced = not fenced
            elif not fenced and re.match(r"#{1,6} ", line):
                name = anchor(line.lstrip("#"))
                numbered, n = name, 0
                while numbered in found:
                    n += 1
                    numbered = f"{name}-{n}"
                found.add(numbered)
    return found


def test_anchor_follows_githubs_rule():
    assert anchor(" Three runs from 2 minutes (2026-12-07)") == "three-runs-from-2-minutes-2026-12-07"
    assert anchor("A large text at the edge of used up is one run") == "a-large-text-at-the-edge-of-used-up-is-one-run"
    assert anchor("Chinese: 西游记's first 300 KB, one run") == "chinese-西游记s-first-300-kb-one-run"


@pytest.mark.parametrize("page", PAGES)
def test_every_link_within_the_repository_leads_to_a_file_and_a_heading(page):
    with open(os.path.join(ROOT, page), encoding="utf-8") as f:
        text = re.sub(r"```.*?```", "", f.read(), flags=re.S)  # code blocks hold no links
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):  # https:, mailto: ... : outside the repository
            continue
        path, _, name = target.partition("#")
        path = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
        if not os.path.exists(os.path.join(ROOT, path)):
            broken.append(f"{target}: no file {path}")
        elif name and path.endswith(".md") and name not in anchors(path):
            broken.append(f"{target}: no heading #{name} in {path}")
    assert not broken, broken
