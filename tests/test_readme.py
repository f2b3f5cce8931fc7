"""The README is the entry point: every code block in it runs as written, it stays short, and its links resolve.

A block is skipped only when the line above its fence says why: ``<!-- skip-test: needs the CIFAR-10 files -->``.
Python blocks run each in a fresh interpreter; shell blocks run line by line in bash, from a scratch folder that sees
the repository's ``configs/``, with the installed ``dprobust`` on the ``PATH``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_LINES = 300
SKIP = re.compile(r"<!--\s*skip-test:\s*(?P<reason>[^>]*?)\s*-->")
FENCE = re.compile(r"^```(?P<language>[\w-]*)\s*$")
SHELL = {"bash", "sh", "shell", "console"}


@dataclass(frozen=True)
class Block:
    language: str
    line: int
    code: str
    skip: str | None


def code_blocks(text: str) -> list[Block]:
    """Every fenced block of ``text`` with its language, first line number and skip reason (if any)."""
    blocks, lines, index = [], text.splitlines(), 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if not opening:
            index += 1
            continue
        end = index + 1
        while not lines[end].startswith("```"):
            end += 1
        above = next((line for line in reversed(lines[:index]) if line.strip()), "")
        marker = SKIP.search(above)
        code = "\n".join(lines[index + 1 : end])
        blocks.append(Block(opening["language"], index + 1, code, marker["reason"] if marker else None))
        index = end + 1
    return blocks


BLOCKS = code_blocks(README.read_text())


def _environment() -> dict[str, str]:
    env = dict(os.environ, WANDB_MODE="offline", WANDB_SILENT="true", OMP_NUM_THREADS="1")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # the installed `dprobust`
    return env


@pytest.mark.parametrize("block", BLOCKS, ids=[f"line{block.line}-{block.language or 'text'}" for block in BLOCKS])
def test_readme_block_runs(block: Block, tmp_path: Path) -> None:
    if block.skip:
        pytest.skip(f"README line {block.line}: {block.skip}")
    assert block.language in SHELL | {"python"}, (
        f"README line {block.line}: a ```{block.language} block; mark it python or bash, or add "
        "<!-- skip-test: reason --> above it"
    )
    (tmp_path / "configs").symlink_to(ROOT / "configs")
    if block.language == "python":
        command = [sys.executable, "-c", block.code]
    else:
        command = ["bash", "-euo", "pipefail", "-c", block.code]
    result = subprocess.run(command, cwd=tmp_path, env=_environment(), capture_output=True, text=True, timeout=600)
    output = f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    assert result.returncode == 0, f"README block at line {block.line} failed:\n{output}"


def test_readme_is_an_entry_point() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= MAX_LINES, f"README.md has {len(text.splitlines())} lines; move detail into docs/"
    skipped = [block for block in BLOCKS if block.skip]
    assert len(skipped) <= 3, f"only blocks that install, download or need a GPU may be skipped: {skipped}"
    assert [block for block in BLOCKS if block.language == "python" and not block.skip], "no Python quickstart"
    assert re.search(r"\b\d+ (passed|skipped|deselected)\b", text) is None, "test counts go stale: leave them out"
    timing = re.search(r"\b\d+(\.\d+)? ?(ms|s|sec|seconds|min|minutes)\b", text)
    assert timing is None, f"timings go stale: leave them out of the README ({timing[0] if timing else ''})"


def test_readme_links_resolve() -> None:
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README.read_text())
    local = [link for link in links if not re.match(r"^[a-z]+:", link)]
    assert local, "the README links into docs/"
    missing = [link for link in local if not (ROOT / link).exists()]
    assert not missing, f"README links to files that do not exist: {missing}"


def test_readme_quickstart_builds_the_model_the_cli_builds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Python quickstart's model is the one ``dprobust fit --config configs/dpsgd/digits.yaml`` trains: the same
    layers, starting with the same normalization layer (which the CLI links in from the data module)."""
    from lightning_dprobust.recipes import CONFIG_DIR, build_recipe, quiet_overrides

    quickstart = next(block for block in BLOCKS if block.language == "python" and "DPSGD(" in block.code)
    setup = quickstart.code.split("\ntrainer =", 1)[0]  # imports, data, module, callback: everything before training
    namespace: dict = {}
    monkeypatch.chdir(tmp_path)
    exec(compile(setup, str(README), "exec"), namespace)
    ours = namespace["module"].model
    cli = build_recipe(CONFIG_DIR / "dpsgd" / "digits.yaml", quiet_overrides(tmp_path))
    assert str(ours) == str(cli.model.model)
    statistics = {name: value for name, value in ours.state_dict().items() if name.endswith(("mean", "std"))}
    expected = {name: value for name, value in cli.model.model.state_dict().items() if name.endswith(("mean", "std"))}
    assert statistics and statistics.keys() == expected.keys()
    for name, value in statistics.items():
        assert value.tolist() == expected[name].tolist(), name
