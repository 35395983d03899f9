#!/usr/bin/env python3
"""Regenerate the values table in charts/cron-runner/README.md from values.yaml.

A comment line starting with `# --` documents the key right below it (more `#` lines may
continue it). The table goes between the `<!-- values:begin -->` and `<!-- values:end -->`
markers; the rest of the README is written by hand.

    python scripts/chart_readme.py           # rewrite the table
    python scripts/chart_readme.py --check   # exit 1 if it is out of date (tests/chart)
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
CHART_DIR = ROOT / "charts" / "cron-runner"
BEGIN = "<!-- values:begin -->"
END = "<!-- values:end -->"

_KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z0-9_.-]+):(?: |$)")
_DOC = re.compile(r"^ *# -- ?(?P<text>.*)$")
_MORE = re.compile(r"^ *# ?(?P<text>.*)$")


@dataclass
class Row:
    path: list[str]
    description: str


def documented_keys(text: str) -> list[Row]:
    """Documented keys in file order. Keys inside list items are values, not settings."""
    rows: list[Row] = []
    stack: list[tuple[int, str]] = []
    pending: list[str] | None = None
    list_owner_indent: int | None = None
    for line in text.splitlines():
        stripped = line.strip()
        indent = len(line) - len(line.lstrip(" "))
        if not stripped:
            pending = None
            continue
        if stripped.startswith("#"):
            doc = _DOC.match(line)
            if doc:
                pending = [doc.group("text")]
            elif pending is not None:
                more = _MORE.match(line)
                pending.append(more.group("text") if more else "")
            continue
        if list_owner_indent is not None and indent > list_owner_indent:
            continue
        list_owner_indent = None
        if stripped.startswith("- "):
            list_owner_indent = stack[-1][0] if stack else 0
            continue
        match = _KEY.match(line)
        if not match:
            pending = None
            continue
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, match.group("key")))
        if pending is not None:
            rows.append(Row([key for _, key in stack], " ".join(pending).strip()))
            pending = None
    return rows


def _type(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "object"
    return "null" if value is None else type(value).__name__


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def table(values_text: str) -> str:
    values = yaml.safe_load(values_text)
    rows = documented_keys(values_text)
    parents = {tuple(r.path[:i]) for r in rows for i in range(1, len(r.path))}
    lines = ["| Key | Type | Default | Description |", "| --- | --- | --- | --- |"]
    for row in rows:
        value: Any = values
        for key in row.path:
            value = value[key]
        if tuple(row.path) in parents:
            default = "see below"
        else:
            default = "`" + json.dumps(value, separators=(", ", ": ")) + "`"
        lines.append(
            f"| `{'.'.join(row.path)}` | {_type(value)} | {_cell(default)} | {_cell(row.description)} |"
        )
    return "\n".join(lines) + "\n"


def render(readme: str, values_text: str) -> str:
    head, begin, rest = readme.partition(BEGIN)
    _, end, tail = rest.partition(END)
    if not begin or not end:
        raise SystemExit(f"README.md has no {BEGIN} ... {END} markers")
    return f"{head}{BEGIN}\n{table(values_text)}{END}{tail}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the table is out of date")
    args = parser.parse_args()
    readme_path = CHART_DIR / "README.md"
    readme = readme_path.read_text()
    expected = render(readme, (CHART_DIR / "values.yaml").read_text())
    if args.check:
        if readme != expected:
            print(
                f"{readme_path.relative_to(ROOT)}: the values table is out of date: run `make chart-docs`"
            )
            return 1
        return 0
    readme_path.write_text(expected)
    return 0


if __name__ == "__main__":
    sys.exit(main())
