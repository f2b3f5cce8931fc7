"""The documentation site builds with ``mkdocs build --strict`` (broken links, a failing docstring reference or a CLI
reference that cannot be generated are errors), every page is reachable from the navigation, the CLI reference is
generated from the parsers, and the design page's map of which files make each paper names files that exist."""

from __future__ import annotations

import glob
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
GENERATED = {"cli_reference.md"}  # written at build time by docs/hooks/cli_reference.py


def _nav_pages(nav: list) -> set[str]:
    pages: set[str] = set()
    for item in nav:
        value = next(iter(item.values())) if isinstance(item, dict) else item
        pages |= _nav_pages(value) if isinstance(value, list) else {value}
    return pages


def _mkdocs_config() -> dict:
    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("!", lambda loader, suffix, node: None)  # MkDocs' !ENV / !relative tags
    return yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=Loader)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    site_dir = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1", OMP_NUM_THREADS="1", WANDB_MODE="offline")
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site_dir)]
    command += ["--config-file", str(ROOT / "mkdocs.yml")]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
    return site_dir


def test_docs_build_strictly(site: Path) -> None:
    assert (site / "index.html").is_file()
    for page in ("methods/stobatch", "dp_callback", "api/methods", "cli_reference"):
        assert (site / page / "index.html").is_file(), page
    assert "DPCallback" in (site / "api" / "callbacks" / "index.html").read_text(), "the API reference is empty"


def test_cli_reference_is_generated_from_the_parsers(site: Path) -> None:
    html = (site / "cli_reference" / "index.html").read_text()
    for command in ("fit", "validate", "test", "certify", "attack", "audit", "zoo", "synthesize"):
        assert f"dprobust {command}" in html, command
    assert "--help failed" not in html and "could not be run" not in html
    assert "usage:" in html


def test_every_page_is_in_the_navigation() -> None:
    in_nav = _nav_pages(_mkdocs_config()["nav"])
    on_disk = {str(path.relative_to(DOCS)) for path in DOCS.rglob("*.md") if "hooks" not in path.parts}
    assert not on_disk - in_nav, f"pages missing from mkdocs.yml's nav: {sorted(on_disk - in_nav)}"
    assert not in_nav - on_disk - GENERATED, f"nav entries without a page: {sorted(in_nav - on_disk - GENERATED)}"


def test_each_method_page_has_its_sections() -> None:
    for page in sorted((DOCS / "methods").glob("*.md")):
        if page.name == "index.md":
            continue
        text = page.read_text()
        for needed in ("| paper |", "| epsilon |", "| what differs from the paper |", "| run it |"):
            assert needed in text, f"{page.name}: no {needed!r} row"


def test_design_map_names_files_that_exist() -> None:
    text = (DOCS / "design.md").read_text()
    section = text.split("## Which files make each paper", 1)[1].split("\n## ", 1)[0]
    paths = [path for path in re.findall(r"`([^`\s]+)`", section) if "/" in path or path.endswith(".py")]
    assert paths
    missing = []
    for path in paths:
        path = path.replace("lp/", "lightning_dprobust/")
        if not path.startswith(("lightning_dprobust/", "configs/", "tests/", "benchmarks/")):
            path = f"benchmarks/{path}"
        if not glob.glob(str(ROOT / path.rstrip("/"))):
            missing.append(path)
    assert not missing, f"docs/design.md's map names missing files: {missing}"
