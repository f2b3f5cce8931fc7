"""Numbers nobody types: the docs' tables are rendered from result files, and a page that differs from its file fails.

``benchmarks/render_results.py`` replaces what lies between ``<!-- results:NAME -->`` and ``<!-- /results:NAME -->``
on every docs page with the table of ``results/NAME.json``; ``--check`` names each page and table that differs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.helpers import load_benchmark

ROOT = Path(__file__).resolve().parents[1]
render_results = load_benchmark("render_results")
results = load_benchmark("results")


def test_every_docs_table_matches_its_result_file(capsys):
    """The repository's pages against its result files: run ``make results`` after a benchmark writes a file."""
    code = render_results.main(["--check"])
    assert code == 0, capsys.readouterr().err


def test_every_result_file_is_one_a_benchmark_wrote():
    """Each file under results/ is a complete record whose command re-runs a benchmark of this repository."""
    for path in sorted((ROOT / "results").glob("*.json")):
        record = results.read_result(path)
        assert record["name"] == path.stem, path
        script = re.match(r"python \S*?benchmarks/([\w/]+\.py)", record["command"])
        assert script and (ROOT / "benchmarks" / script[1]).is_file(), record["command"]
        assert record["rows"] and all(len(row) == len(record["columns"]) for row in record["rows"]), path


def test_every_benchmark_that_prints_a_table_writes_a_result_file():
    """Every script of benchmarks/ with a ``main`` (helpers such as seeds.py have none) calls ``write_result``."""
    helpers = {"results.py", "render_results.py"}
    texts = {path.name: path.read_text() for path in sorted((ROOT / "benchmarks").glob("*.py"))}
    scripts = [name for name, text in texts.items() if "def main(" in text and name not in helpers]
    assert len(scripts) >= 18, scripts
    silent = [name for name in scripts if "write_result(" not in texts[name]]
    assert not silent, f"benchmarks that print tables without writing a result file: {silent}"


def _tree(tmp_path: Path, page_text: str) -> tuple[Path, Path]:
    (tmp_path / "docs" / "methods").mkdir(parents=True)
    page = tmp_path / "docs" / "methods" / "page.md"
    page.write_text(page_text)
    (tmp_path / "README.md").write_text("# readme\n\nno tables here\n")
    return page, tmp_path / "results"


def _write(directory: Path, name: str = "toy", cell: str = "92.86 +- 1.16") -> None:
    results.write_result(
        name,
        title="A toy table",
        columns=["method", "acc (%)"],
        rows=[["DP-SGD", cell], ["non-private", "97.00 +- 0.20"]],
        seeds=[0, 1, 2],
        notes="mean +- sample standard deviation over 3 seeds (0, 1, 2).",
        directory=directory,
    )


PAGE = "# Results\n\nBefore.\n\n<!-- results:toy -->\n| typed | by hand |\n<!-- /results:toy -->\n\nAfter.\n"


def test_render_replaces_only_what_lies_between_the_markers(tmp_path):
    page, directory = _tree(tmp_path, PAGE)
    _write(directory)
    assert render_results.main(["--root", str(tmp_path)]) == 0
    text = page.read_text()
    assert text.startswith("# Results\n\nBefore.\n\n<!-- results:toy -->\n\n| method | acc (%) |\n")
    assert text.endswith("\n\n<!-- /results:toy -->\n\nAfter.\n")
    assert "| DP-SGD | 92.86 +- 1.16 |" in text and "typed" not in text
    caption = next(line for line in text.splitlines() if line.startswith("*A toy table*"))
    record = json.loads((directory / "toy.json").read_text())
    assert "(seeds 0, 1, 2). Mean +- sample standard deviation over 3 seeds (0, 1, 2). Source: " in caption
    assert f"`{record['command']}`" in caption and record["date"][:10] in caption
    assert f"`{record['commit'][:12]}" in caption and "`results/toy.json`" in caption
    assert render_results.main(["--root", str(tmp_path), "--check"]) == 0
    assert render_results.main(["--root", str(tmp_path)]) == 0 and page.read_text() == text  # idempotent


def test_check_names_the_page_and_table_that_differ_from_their_file(tmp_path, capsys):
    page, directory = _tree(tmp_path, PAGE)
    _write(directory)
    assert render_results.main(["--root", str(tmp_path)]) == 0
    rendered = page.read_text()
    page.write_text(rendered.replace("92.86 +- 1.16", "93.10 +- 1.16"))  # a number typed over the rendered one
    capsys.readouterr()
    assert render_results.main(["--root", str(tmp_path), "--check"]) == 1
    assert "docs/methods/page.md: table 'toy' differs from results/toy.json" in capsys.readouterr().err
    page.write_text(rendered)
    _write(directory, cell="91.00 +- 2.00")  # the benchmark re-ran: the page is stale
    assert render_results.main(["--root", str(tmp_path), "--check"]) == 1
    assert "docs/methods/page.md: table 'toy' differs" in capsys.readouterr().err
    assert page.read_text() == rendered  # --check writes nothing
    assert render_results.main(["--root", str(tmp_path)]) == 0 and "| DP-SGD | 91.00 +- 2.00 |" in page.read_text()


def test_a_marker_without_its_file_is_named_and_left_alone(tmp_path, capsys):
    page, directory = _tree(tmp_path, PAGE.replace("toy", "never_run"))
    _write(directory)
    for check in ([], ["--check"]):
        assert render_results.main(["--root", str(tmp_path), *check]) == 1
        err = capsys.readouterr().err
        assert "docs/methods/page.md: marker 'results:never_run' has no file results/never_run.json" in err
    assert page.read_text() == PAGE.replace("toy", "never_run")


def test_an_unclosed_marker_is_named(tmp_path, capsys):
    page, directory = _tree(tmp_path, "<!-- results:toy -->\n| typed |\n")
    _write(directory)
    assert render_results.main(["--root", str(tmp_path), "--check"]) == 1
    assert "docs/methods/page.md: marker 'results:toy' is never closed" in capsys.readouterr().err


def test_the_readme_is_a_page_and_every_table_of_a_page_is_rendered(tmp_path):
    _, directory = _tree(tmp_path, "no markers\n")
    _write(directory, "first")
    _write(directory, "second", cell="50.00 (1 seed)")
    readme = tmp_path / "README.md"
    readme.write_text(
        "<!-- results:first -->\n<!-- /results:first -->\ntext\n<!-- results:second -->\nx\n<!-- /results:second -->\n"
        "A sentence quoting `<!-- results:NAME -->` and `<!-- /results:NAME -->` is no marker.\n"
    )
    assert render_results.main(["--root", str(tmp_path)]) == 0
    text = readme.read_text()
    assert "| DP-SGD | 92.86 +- 1.16 |" in text and "| DP-SGD | 50.00 (1 seed) |" in text and "\ntext\n" in text
    assert text.endswith("A sentence quoting `<!-- results:NAME -->` and `<!-- /results:NAME -->` is no marker.\n")


def test_results_dir_defaults_to_the_environment_then_the_repository(tmp_path, monkeypatch):
    monkeypatch.delenv(results.RESULTS_DIR_VARIABLE, raising=False)
    assert results.results_directory() == ROOT / "results"
    monkeypatch.setenv(results.RESULTS_DIR_VARIABLE, str(tmp_path))
    assert results.results_directory() == tmp_path and results.results_directory("x") == Path("x")
    with pytest.raises(ValueError, match="plain file stem"):
        results.write_result("../escape", title="t", columns=["a"], rows=[["1"]])
