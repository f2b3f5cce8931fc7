"""Turn AIN checkpoints trained with ``configs/ain/digits.yaml`` into zoo entries of kind ``attack``.

For each ``--ckpt NAME=PATH[:OVERRIDES_JSON]`` pair: writes the generator (behind an identity normalization, as
``create_model("ain_generator", ...)`` builds it) to ``zoo/weights/<NAME>-<sha8>.pth`` and the entry to
``zoo/entries/<NAME>.yaml``, with its success rates on the digits test split at Linf 0.1, 0.2 and 0.3 against its
target (AINAttack, seed 0) and the bound it was trained to. Usage:
``python benchmarks/ain_zoo_entries.py --ckpt ain_generator.ain_digits_target8=runs/.../last.ckpt --overrides '{...}'``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess

import torch

from lightning_dprobust import zoo
from lightning_dprobust.checkpoint_io import read_checkpoint
from lightning_dprobust.data import DigitsDataModule
from lightning_dprobust.models import create_model
from lightning_dprobust.paths import shipped_root
from lightning_dprobust.robustness.ain_attack import AINAttack, load_ain_generator, success_rate
from lightning_dprobust.zoo.catalog import Entry

CONFIG = "configs/ain/digits.yaml"
PAPER = (
    "Tang 2021, Deep Learning with Differential Privacy and Adversarial Robustness, PhD thesis, Emory University, "
    "chapter 5 (AIN)"
)


def build_entry(name: str, ckpt: str, overrides: dict) -> Entry:
    root = shipped_root()
    hp = read_checkpoint(ckpt)["hyper_parameters"]
    generator = load_ain_generator(ckpt)
    kwargs = {
        "num_classes": hp["num_classes"],
        "input_shape": list(hp["input_shape"]),
        **(hp.get("generator_kwargs") or {}),
        "noise_std": hp["noise_std"],
    }
    model = create_model("ain_generator", **kwargs)
    model.net.load_state_dict(generator.state_dict())
    state = {key: value.contiguous() for key, value in model.state_dict().items()}
    scratch = root / "zoo" / "weights" / f"{name}.tmp"
    torch.save(state, scratch)
    sha = hashlib.sha256(scratch.read_bytes()).hexdigest()
    file = f"{name}-{sha[:8]}.pth"
    scratch.rename(root / "zoo" / "weights" / file)
    target = zoo.load(hp["target"])
    data = DigitsDataModule()
    data.setup("test")
    x, y = data.test_set.tensors
    bound = round(float(generator.bound), 6)
    target_class = None if int(generator.target_class) < 0 else int(generator.target_class)
    metrics = {"bound": bound}
    for eps in (0.1, 0.2, 0.3):
        if eps >= bound - 1e-6:
            adversarial = AINAttack(target, generator, eps=eps, seed=0)(x, y)
            metrics[f"success@{eps}"] = round(success_rate(target, adversarial, y, target_class), 6)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=root).stdout.strip()
    config_sha = hashlib.sha256((root / CONFIG).read_bytes()).hexdigest()
    mode = f"targeted at class {target_class}" if target_class is not None else "untargeted"
    return Entry.from_dict(
        {
            "kind": "attack",
            "name": name,
            "status": "shipped",
            "url": f"weights/{file}",
            "file": file,
            "sha256": sha,
            "model": {"name": "ain_generator", "kwargs": kwargs},
            "preprocessing": {
                "input_shape": kwargs["input_shape"],
                "value_range": [0.0, 1.0],
                "normalization": "model",
                "transform": "scikit-learn load_digits() images divided by 16 (8x8 grayscale)",
            },
            "meta": {
                "dataset": "digits",
                "num_params": sum(p.numel() for p in model.parameters()),
                "method": "AIN",
                "paper": PAPER,
                "metrics": metrics,
                "privacy": None,
                "smoothing": None,
                "recipe": {"config": CONFIG, "overrides": overrides, "config_sha256": config_sha, "commit": commit},
                "target_metrics": {},
                "target_citation": "digits is the library's embedded dataset; no paper reports it",
                "classifier": hp["target"],
                "robustness": {"attack": "AIN", "eps": bound, "target_class": target_class},
                "notes": f"AIN generator {mode}, trained against {hp['target']} down to Linf {bound:g}; use it with "
                f"AINAttack(model, '{name}', eps >= {bound:g}) or `dprobust attack --attack AIN --ain {name}`.",
            },
        },
        name,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ckpt", action="append", required=True, help="NAME=PATH of an AIN checkpoint")
    parser.add_argument("--overrides", default="{}", help="the recipe overrides used to train them (JSON)")
    args = parser.parse_args()
    for pair in args.ckpt:
        name, path = pair.split("=", 1)
        overrides = json.loads(args.overrides)
        if name.endswith("untargeted"):
            overrides = {**overrides, "model.init_args.target_class": None}
        entry = build_entry(name, path, overrides)
        (shipped_root() / "zoo" / "entries" / f"{name}.yaml").write_text(entry.to_yaml())
        print(name, entry.meta["metrics"])


if __name__ == "__main__":
    main()
