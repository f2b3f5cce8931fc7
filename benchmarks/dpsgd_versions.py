"""DP-SGD's test accuracy on the digits recipe under two versions of this library (docs/methods/dpsgd.md).

For each version (today's tree, and ``--before DIR``, a checkout of an older commit such as ``git archive d5732e6~1 |
tar -x -C DIR``), each target epsilon (``--targets``) and each seed (``--seeds``): ``dprobust fit`` of that version's
own ``configs/dpsgd/digits.yaml`` with ``seed_everything`` set to the seed and the DPCallback's ``target_epsilon`` to
the target (wherever that version's recipe holds the callback: its ``dp`` group, or the trainer's callbacks), then
``dprobust test`` of the run's last checkpoint, whose accuracy is read from the table Lightning prints. Each command
is its own process in a fresh folder (``versions.py``). The DPCallback's own randomness (Poisson masks, noise) is
each version's default: today it is secret (drawn from the operating system, so a seed fixes only the model's
initialization); before ``d5732e6`` it came from torch's generator, seeded by ``seed_everything``.

Usage: ``python benchmarks/dpsgd_versions.py --before DIR --before-label COMMIT [--targets 1 3 8] [--seeds 0 1 2 3 4]``
"""

from __future__ import annotations

import argparse
import re
import subprocess
import tempfile
from pathlib import Path

import yaml
from seeds import spread_cell
from versions import copy_source, dprobust_command, isolated_environment

from results import add_results_arguments, result_name, write_result

ROOT = Path(__file__).resolve().parents[1]
RECIPE = Path("configs/dpsgd/digits.yaml")
QUIET = {"logger": False, "enable_progress_bar": False, "enable_model_summary": False}
TEST_ACCURACY = re.compile(r"test[/_]acc\w*\s*[│|]?\s*([0-9.]+)")


def recipe_at(src: Path, target_epsilon: float, seed: int, folder: Path) -> Path:
    """The version's digits recipe with ``seed`` and ``target_epsilon``, no logger, written into ``folder``."""
    config = yaml.safe_load((src / RECIPE).read_text())
    config["seed_everything"] = seed
    config["trainer"] = {**config["trainer"], **QUIET, "default_root_dir": str(folder / "run")}
    callbacks = [entry["init_args"] for entry in config["trainer"].get("callbacks") or []
                 if entry["class_path"].endswith("DPCallback")]  # fmt: skip
    dp_arguments = config["dp"] if "dp" in config else callbacks[0]
    dp_arguments.update(target_epsilon=target_epsilon, noise_multiplier=None)
    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_accuracy(src: Path, target_epsilon: float, seed: int) -> float:
    """Fit the recipe at ``src``, test its last checkpoint, return the test accuracy."""
    with tempfile.TemporaryDirectory(prefix="dpsgd-versions-") as name:
        folder = Path(name)
        config = str(recipe_at(src, target_epsilon, seed, folder))
        env = isolated_environment(src, folder)
        subprocess.run(dprobust_command(["fit", "--config", config]), cwd=folder, env=env, check=True,
                       capture_output=True)  # fmt: skip
        checkpoint = next((folder / "run").rglob("last.ckpt"))
        tested = subprocess.run(dprobust_command(["test", "--config", config, "--ckpt_path", str(checkpoint)]),
                                cwd=folder, env=env, check=True, capture_output=True, text=True)  # fmt: skip
        found = TEST_ACCURACY.findall(tested.stdout + tested.stderr)
        if not found:
            raise RuntimeError(f"no test accuracy in the output of dprobust test:\n{tested.stdout[-2000:]}")
        return float(found[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="a checkout of the older commit")
    parser.add_argument("--before-label", default="before", help="its name in the table (e.g. its commit)")
    parser.add_argument("--targets", type=float, nargs="+", default=[1.0, 3.0, 8.0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    add_results_arguments(parser)
    args = parser.parse_args()
    accuracies: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory(prefix="dpsgd-sources-") as name:
        for label, source in ((args.before_label, args.before), ("today", ROOT)):
            src = copy_source(source, Path(name) / label)
            for target in args.targets:
                for seed in args.seeds:
                    accuracy = test_accuracy(src, target, seed)
                    accuracies.setdefault(label, {}).setdefault(f"{target:g}", []).append(accuracy)
                    print(f"{label} target {target:g} seed {seed}: test accuracy {accuracy:.4f}", flush=True)
    labels = [args.before_label, "today"]
    rows = [[f"{target:g}", *(spread_cell(accuracies[label][f"{target:g}"], scale=100) for label in labels)]
            for target in args.targets]  # fmt: skip
    write_result(
        result_name(args, "dpsgd_versions"),
        title="DP-SGD on digits: test accuracy (%) of the recipe under two versions",
        columns=["target epsilon", *labels],
        rows=rows,
        seeds=args.seeds,
        notes="mean +- sample standard deviation over the seeds (seed_everything); each version's own digits recipe "
        "(40 epochs, batch 256, clip 1, delta 1e-5, rdp) and its default DPCallback randomness; the last checkpoint "
        "tested",
        raw=accuracies,
        directory=args.results_dir,
    )


if __name__ == "__main__":
    main()
