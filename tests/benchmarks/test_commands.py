"""Every command a figure cites runs as shown: each ``python -m benchmarks.MODULE ...`` line of a results table's
``command`` (``docs/results/*.json``) and of README's Performance table is accepted by that module's own argument
parser, its modes are modes ``benchmarks.modes`` knows, and every test file a command runs exists. Nothing is run.

A command's text is read as a shell would read it: backslash continuations joined, ``# ...`` comments dropped, a
``run="..."`` assignment expanded where ``$run`` is used."""

from __future__ import annotations

import importlib
import json
import re
import shlex

import pytest

from benchmarks import modes
from tests.conftest import ROOT

RESULTS = sorted((ROOT / "docs" / "results").glob("*.json"))


def command_lines(text: str) -> list[list[str]]:
    """The words of each command in ``text``, shell-style (see the module docstring)."""
    variables: dict[str, str] = {}
    out = []
    for line in text.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        if not words:
            continue
        if len(words) == 1 and (m := re.fullmatch(r"(\w+)=(.*)", words[0])):
            variables[m[1]] = m[2]
            continue
        expanded = []
        for w in words:
            expanded += shlex.split(variables[w[1:]]) if w.startswith("$") and w[1:] in variables else [w]
        out.append(expanded)
    return out


def cited_commands() -> list[tuple[str, list[str]]]:
    """(where, words) of every command the results tables and README's table cite."""
    out = []
    for path in RESULTS:
        doc = json.loads(path.read_text())
        texts = [doc["command"]] if "command" in doc else []
        if path.name == "readme.json":  # README's table: the command column, where it shows one
            column = doc["columns"].index("command")
            texts += [row["cells"][column].strip("`") for row in doc["rows"] if row["cells"][column].startswith("`")]
        for text in texts:
            out += [(path.name, words) for words in command_lines(text)]
    return out


def test_commands_are_read_as_a_shell_reads_them():
    text = 'run="python -m benchmarks.served --pinning strict"\n$run --modes a b   # run A\n' \
           "python -m benchmarks.offline runners \\\n    --x 1\n"
    assert command_lines(text) == [["python", "-m", "benchmarks.served", "--pinning", "strict", "--modes", "a", "b"],
                                   ["python", "-m", "benchmarks.offline", "runners", "--x", "1"]]


@pytest.mark.parametrize(("where", "words"), cited_commands(), ids=lambda v: v if isinstance(v, str) else None)
def test_every_cited_command_is_accepted_by_what_it_runs(where, words):
    if words[:2] == ["python", "-m"] and words[2].startswith("benchmarks."):
        module = importlib.import_module(words[2])
        try:
            args = module.parser().parse_args(words[3:])
        except SystemExit as e:
            pytest.fail(f"{where}: {shlex.join(words)}: refused by {words[2]}'s parser ({e})")
        for name in getattr(args, "modes", None) or ():
            try:
                modes.parse(name)
            except modes.ModeError as e:
                pytest.fail(f"{where}: {shlex.join(words)}: {e}")
    elif words[:3] == ["python", "-m", "pytest"]:
        for word in words[3:]:
            if not word.startswith("-"):
                assert (ROOT / word.split("::")[0]).exists(), f"{where}: {word} does not exist"
    elif words[0] == "bash":
        assert (ROOT / words[1]).exists(), f"{where}: {words[1]} does not exist"
    else:
        assert words[0] == "make", f"{where}: a command this test cannot check: {words}"
