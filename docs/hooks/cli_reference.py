"""MkDocs hook: the CLI reference page, written at build time from the parsers themselves.

``on_files`` runs this file as a script in a fresh interpreter, which calls ``dprobust --help`` and
``dprobust <subcommand> --help`` (and one level of sub-subcommands, e.g. ``zoo list``) in-process and prints the
page; the page is added to the site as ``cli_reference.md``. Subcommands are found in the top-level help's usage line
and in ``lightning_dprobust.cli.main.SUBCOMMANDS``, so a new or renamed subcommand appears without editing this file.
A subcommand whose ``--help`` fails is a build warning, which ``mkdocs build --strict`` turns into an error.

Run by hand: ``python docs/hooks/cli_reference.py`` prints the page.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

PAGE = "cli_reference.md"
FAILED = "<!-- cli-reference: failed -->"
LIGHTNING_SUBCOMMANDS = ("fit", "validate", "test")

log = logging.getLogger("mkdocs.hooks.cli_reference")


def _help(argv: list[str]) -> tuple[str, bool]:
    """The output of ``dprobust *argv --help`` and whether it succeeded (exit status 0)."""
    from lightning_dprobust.cli.main import main

    buffer = io.StringIO()
    status: object = 0
    with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
        try:
            status = main([*argv, "--help"])
        except SystemExit as exit_:
            status = exit_.code
        except Exception as error:  # noqa: BLE001 - reported on the page and as a build warning
            buffer.write(f"{type(error).__name__}: {error}\n")
            status = 1
    return buffer.getvalue().rstrip() + "\n", status in (0, None)


def _positional_choices(help_text: str) -> list[str]:
    """Choices of the positional argument in the usage line (``{list,info,download,build}``), in order."""
    usage = help_text.split("\n\n", 1)[0]
    tokens = usage.split()
    for previous, token in zip(["", *tokens], tokens, strict=False):
        match = re.fullmatch(r"\{([\w,\-]+)\}", token)
        takes_value = previous.lstrip("[").startswith("-") and not previous.endswith("]")  # `--flag {a,b}`
        if match and not takes_value:
            return match.group(1).split(",")
    return []


def _subcommands(top_help: str) -> list[str]:
    names = list(LIGHTNING_SUBCOMMANDS) + _positional_choices(top_help)
    with contextlib.suppress(ImportError, AttributeError):
        names += list(importlib.import_module("lightning_dprobust.cli.main").SUBCOMMANDS)
    return list(dict.fromkeys(names))


def render() -> str:
    """The whole page as Markdown."""
    os.environ.update({"COLUMNS": "100", "NO_COLOR": "1", "TERM": "dumb", "WANDB_MODE": "offline"})
    sections = [
        "# CLI reference",
        "Generated from the parsers each time the documentation is built (`docs/hooks/cli_reference.py` runs "
        "`dprobust --help` and `dprobust SUBCOMMAND --help`); nothing on this page is typed by hand. How the commands "
        "fit together: [Using the CLI](cli.md).",
    ]
    failed = []
    top, ok = _help([])
    if not ok:
        failed.append("dprobust")
    sections += ["## `dprobust`", f"```text\n{top}```"]
    for name in _subcommands(top):
        text, ok = _help([name])
        if not ok:
            failed.append(f"dprobust {name}")
        sections += [f"## `dprobust {name}`", f"```text\n{text}```"]
        for action in _positional_choices(text) if ok else []:
            sub_text, sub_ok = _help([name, action])
            if not sub_ok:
                failed.append(f"dprobust {name} {action}")
            sections += [f"### `dprobust {name} {action}`", f"```text\n{sub_text}```"]
    if failed:
        sections.append(f"{FAILED} --help failed for: {', '.join(failed)}")
    return "\n\n".join(sections) + "\n"


def on_files(files, config):  # noqa: ANN001, ANN201 - MkDocs hook signature
    """Add the generated page to the site's files."""
    from mkdocs.structure.files import File

    result = subprocess.run(
        [sys.executable, str(Path(__file__).resolve())], capture_output=True, text=True, check=False, timeout=300
    )
    content = result.stdout
    if result.returncode != 0 or not content.startswith("# CLI reference"):
        log.warning("the CLI reference could not be generated:\n%s", result.stderr[-2000:])
        content = "# CLI reference\n\nThe parsers could not be run when this site was built.\n"
    elif FAILED in content:
        log.warning("the CLI reference: %s", content.split(FAILED, 1)[1].strip())
    files.append(File.generated(config, PAGE, content=content))
    return files


if __name__ == "__main__":
    sys.stdout.write(render())
