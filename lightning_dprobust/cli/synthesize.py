"""``dprobust synthesize``: synthetic EHRs from an IGAMT checkpoint or released artifact, as a long-format CSV.

Only the released artifact is used (:meth:`~lightning_dprobust.methods.igamt.IGAMT.release`: G, Dec_i, Dec.last),
so the output is post-processing of the trained generator. The CSV has one row per observed temporal value:
``patient, time, feature, value`` followed by one column per static feature (repeated on each of the patient's
rows). ``time`` is the running sum of the generated time increments. When the checkpoint carries the data schema
(feature names and scalers, stored by ``fit`` from the EHR data module), values and times are in raw units;
otherwise they stay in the scaled units ``[0, 1]`` and the command says so. The scalers are the schema's declared
(public) ranges, unless the data module read some from the training records (``scaling="train"``): those are not
differentially private, and the command names them.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from lightning_dprobust.cli.args import CommandParser, require
from lightning_dprobust.models.ehr_release import FORMAT, ReleasedSynthesizer

SCALED_NOTE = "values and times are in scaled units [0, 1]: the checkpoint carries no data schema to undo the scaling"
SCHEMA_NOTE = "values are in raw units through the data schema's declared (public) scalers"
DERIVED_NOTE = (
    "values are in raw units through the data schema's scalers, of which those of {features} were read from the "
    "training records: those ranges are not differentially private, and this CSV reveals them"
)


def scaling_note(schema: dict[str, Any] | None) -> str:
    """What the CSV's units are, and whether its scalers are public (a schema without ``data_derived`` features)."""
    if schema is None:
        return SCALED_NOTE
    derived = list(schema.get("data_derived") or ())
    return DERIVED_NOTE.format(features=derived) if derived else SCHEMA_NOTE


def _parser() -> CommandParser:
    parser = CommandParser(
        prog="dprobust synthesize", description="Synthetic EHRs from an IGAMT checkpoint or release, as a CSV."
    )
    add = parser.add_argument
    parser.add_flag(
        "--ckpt_path",
        "--ckpt",
        dest="ckpt",
        required=True,
        help="an IGAMT or EHR baseline .ckpt (from dprobust fit), a release file (ReleasedSynthesizer) or a zoo name "
        "(e.g. igamt.dp_synthetic_ehr_s10)",
    )
    add("--n", type=int, default=1000, help="number of synthetic patients (default: 1000)")
    add("--out", required=True, help="the CSV file to write (an existing file only with --overwrite)")
    add("--overwrite", action="store_true", help="replace --out if it exists (never the --ckpt_path file)")
    add("--steps", type=int, default=None, help="temporal steps per patient (default: the model's max_steps)")
    add("--seed", type=int, default=None, help="seed of the synthesis draws (default: fresh entropy)")
    parser.add_flag(
        "--batch_size", "--batch-size", type=int, default=256, help="patients synthesized at once (default: 256)"
    )
    add("--mask", choices=("bernoulli", "threshold"), default="bernoulli", help="masks to observations (see assemble)")
    return parser


def load_release(path: str | Path) -> ReleasedSynthesizer:
    """The released artifact of an IGAMT or EHR baseline checkpoint, a release file or a zoo synthesizer entry; files
    are read with ``weights_only=True``. A checkpoint written by ``dprobust fit`` carries LightningCLI's own keys
    (``_class_path``, ``_instantiator``) among its hyperparameters: they name the class, they are not arguments.

    Raises:
        FileNotFoundError: ``path`` is neither a file nor a zoo entry.
        ValueError: the file is truncated, damaged or holds pickled code (a ``CheckpointError``); a release whose
            config or weights are incomplete or foreign; a checkpoint whose hyperparameters or weights do not fit its
            synthesizer; a file that is neither.
    """
    from lightning_dprobust.checkpoint_io import read_checkpoint

    if not Path(path).is_file():
        return _zoo_release(str(path))
    saved = read_checkpoint(path)  # one line for a truncated, empty or foreign file, or pickled code
    if saved.get("format") == FORMAT:
        return _release_from(saved, str(path))
    if isinstance(saved.get("hyper_parameters"), dict):
        hparams = {key: value for key, value in saved["hyper_parameters"].items() if not key.startswith("_")}
        saved = {**saved, "hyper_parameters": hparams}
    from lightning_dprobust.methods.ehr_baselines import BASELINES

    name = saved.get("ehr_baseline")
    if name is not None:  # VAE, GAN, VAE-GAN, AAE, DAAE: the same released artifact
        if name not in BASELINES:
            raise ValueError(f"{path} names the EHR baseline {name!r}; known: {', '.join(BASELINES)}")
        return _rebuilt(BASELINES[name], saved, str(path)).release()
    hparams = saved.get("hyper_parameters")
    if not isinstance(hparams, dict) or "static_groups" not in hparams or "variant" not in hparams:
        raise ValueError(f"{path} is neither an IGAMT checkpoint nor an EHR synthesizer release")
    from lightning_dprobust.methods.igamt import IGAMT

    return _rebuilt(IGAMT, saved, str(path)).release()


def _rebuilt(cls: type, saved: dict[str, Any], source: str) -> Any:
    """``cls`` built from a checkpoint's hyperparameters, its weights loaded and its ``ehr_schema`` set; one
    ``ValueError`` for hyperparameters it does not take or weights of another architecture."""
    from lightning_dprobust.checkpoint_io import check_state_dict_fits
    from lightning_dprobust.methods.checkpoints import check_hyperparameters_taken

    hparams = saved["hyper_parameters"]
    check_hyperparameters_taken(cls, hparams, source)
    if not isinstance(saved.get("state_dict"), dict):
        raise ValueError(f"--ckpt_path {source} has no 'state_dict': its weights are needed to synthesize")
    module = cls(**hparams)
    check_state_dict_fits(module, saved["state_dict"], source)
    module.load_state_dict(saved["state_dict"])
    module.ehr_schema = saved.get("ehr_schema")
    return module


def _release_from(saved: dict[str, Any], source: str) -> ReleasedSynthesizer:
    """A release file's synthesizer; one ``ValueError`` naming what is missing, foreign or resized."""
    from lightning_dprobust.checkpoint_io import check_state_dict_fits
    from lightning_dprobust.models.ehr_release import CONFIG_KEYS, OPTIONAL_KEYS

    config, state = saved.get("config"), saved.get("state")
    fix = "the file is damaged or was edited: save the release again (ReleasedSynthesizer.save) or copy it again"
    if not isinstance(config, dict) or not isinstance(state, dict):
        absent = "config" if not isinstance(config, dict) else "state"
        raise ValueError(f"EHR synthesizer release {source} has no {absent!r} dictionary: {fix}")
    missing = [key for key in CONFIG_KEYS if key not in config]
    unknown = sorted(set(config) - set(CONFIG_KEYS) - set(OPTIONAL_KEYS))
    if missing or unknown:
        problem = f"lacks {missing}" if missing else f"holds unknown keys {unknown} (another version's?)"
        raise ValueError(f"EHR synthesizer release {source}: its config {problem}: {fix}")
    release = ReleasedSynthesizer(config, saved.get("schema"))
    check_state_dict_fits(release, state, source)
    release.load_state_dict(state)
    return release


def _zoo_release(name: str) -> ReleasedSynthesizer:
    """The released synthesizer of the zoo entry ``name`` (verified download); a name that is no entry is a missing
    file."""
    from lightning_dprobust.zoo import Zoo
    from lightning_dprobust.zoo.catalog import ZooError

    zoo = Zoo()
    if name not in zoo.entries():
        raise FileNotFoundError(
            f"--ckpt_path {name} does not exist as a file and is not a zoo entry (see `dprobust zoo list`)"
        )
    try:
        model = zoo.load(name)
    except ZooError as error:
        raise ValueError(f"--ckpt_path {name}: {error}") from error
    if not isinstance(model, ReleasedSynthesizer):
        raise ValueError(
            f"--ckpt_path {name} is a zoo entry but not an EHR synthesizer (it is a {type(model).__name__})"
        )
    return model


def synthesize_command(argv: Sequence[str]) -> None:
    """``dprobust synthesize --ckpt_path ... --n 1000 --out file.csv``."""
    args = _parser().parse_args(argv)
    require(args.n >= 1, "--n", args.n, "an integer >= 1")
    require(args.batch_size >= 1, "--batch_size", args.batch_size, "an integer >= 1")
    check_target(Path(args.out), Path(args.ckpt), args.overwrite)
    release = load_release(args.ckpt)
    steps = release.config["max_steps"] if args.steps is None else args.steps
    require(1 <= steps <= release.config["max_steps"], "--steps", steps, f"in 1..{release.config['max_steps']}")
    generator = torch.Generator()
    if args.seed is None:
        generator.seed()
    else:
        generator.manual_seed(args.seed)
    sizes = [min(args.batch_size, args.n - i) for i in range(0, args.n, args.batch_size)]
    parts = [release.sample(size, steps, generator, args.mask) for size in sizes]
    x, m = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
    rows = write_long_csv(x, m, release, Path(args.out))
    print(f"wrote {args.n} synthetic patients ({rows} observed values) to {args.out}")
    print(f"note: {scaling_note(release.schema)}")


def check_target(out: Path, source: Path, overwrite: bool) -> None:
    """Never destroy work: ``--out`` is not the source checkpoint or release, and not an existing file unless
    ``--overwrite``."""
    if source.exists() and out.exists() and out.resolve() == source.resolve():
        raise ValueError(f"--out {out} is the --ckpt_path file itself: write the CSV elsewhere")
    if out.exists() and not overwrite:
        raise ValueError(f"--out {out} exists: pass another path, or --overwrite to replace it")
    if out.is_dir():
        raise ValueError(f"--out {out} is a folder: pass the CSV file's path")


def write_long_csv(x: torch.Tensor, m: torch.Tensor, release: ReleasedSynthesizer, path: Path) -> int:
    """Write ``(x, m)`` ``[n, 1 + T, F]`` in the long format; returns the number of value rows."""
    layout = _Layout(release)
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with path.open("w", newline="") as stream:
        writer = csv.writer(stream)
        writer.writerow(["patient", "time", "feature", "value", *layout.static_names])
        for patient in range(x.shape[0]):
            static = layout.static_values(x[patient, 0])
            times = layout.times(x[patient, 1:, 0], m[patient, 1:, 0])
            for step, feature in (m[patient, 1:, 1:] > 0.5).nonzero().tolist():
                value = layout.value(feature + 1, float(x[patient, step + 1, feature + 1]))
                writer.writerow(
                    [patient, f"{times[step]:.6g}", layout.feature_names[feature + 1], f"{value:.6g}", *static]
                )
                count += 1
    return count


class _Layout:
    """Names and inverse scaling from the release's schema (plain data), or generic names in scaled units."""

    def __init__(self, release: ReleasedSynthesizer) -> None:
        config, schema = release.config, release.schema
        self.schema = schema
        if schema is not None:
            self.feature_names = list(schema["feature_names"])
            self.fields = [dict(field) for field in schema["static"]]
        else:
            self.feature_names = ["time_increment"] + [f"feature_{j}" for j in range(1, config["num_features"])]
            self.fields = _generic_fields(config["static_continuous"], config["static_groups"])
        self.static_names = [field["name"] for field in self.fields]

    def static_values(self, start: torch.Tensor) -> list[Any]:
        values: list[Any] = []
        for field in self.fields:
            categories = field.get("categories") or ()
            if categories:
                slots = start[field["start"] : field["start"] + len(categories)]
                values.append(categories[int(slots.argmax())])
            else:
                raw = float(start[field["start"]])
                values.append(f"{field['low'] + raw * (field['high'] - field['low']):.6g}")
        return values

    def times(self, increments: torch.Tensor, observed: torch.Tensor) -> list[float]:
        """Running sum of the observed increments (a missing increment counts as 0)."""
        raw = [self.value(0, float(v)) if o > 0.5 else 0.0 for v, o in zip(increments, observed, strict=True)]
        return torch.cumsum(torch.tensor(raw, dtype=torch.float64), 0).tolist()

    def value(self, feature: int, scaled: float) -> float:
        if self.schema is None or not math.isfinite(scaled):
            return scaled
        low, high = self.schema["temporal_low"][feature], self.schema["temporal_high"][feature]
        return low + scaled * (high - low)


def _generic_fields(continuous: int, groups: Sequence[int]) -> list[dict[str, Any]]:
    fields: list[dict[str, Any]] = [
        {"name": f"static_{j}", "start": j, "categories": (), "low": 0.0, "high": 1.0} for j in range(continuous)
    ]
    start = continuous
    for g, width in enumerate(groups):
        categories = tuple(f"category_{c}" for c in range(width))
        fields.append({"name": f"static_group_{g}", "start": start, "categories": categories})
        start += width
    return fields
