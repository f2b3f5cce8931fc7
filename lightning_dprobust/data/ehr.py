"""Temporal electronic health records (EHR) as ``(x, m)`` tensors, preprocessed as in IGAMT (Tang, "Deep Learning with
Differential Privacy and Adversarial Robustness", PhD thesis, Emory University 2021, section 4.3.2)."""

from __future__ import annotations

from collections.abc import Mapping

import lightning as L
import torch
from torch import Tensor
from torch.utils.data import DataLoader, TensorDataset
from typing_extensions import override

from lightning_dprobust.data import ehr_csv, ehr_mimic, ehr_synthetic
from lightning_dprobust.data.base import resolve_data_dir
from lightning_dprobust.data.ehr_csv import read_long_csv
from lightning_dprobust.data.ehr_mimic import VITALS, read_mimic_iv_ed
from lightning_dprobust.data.ehr_records import RawRecord, encode, fit_schema
from lightning_dprobust.data.ehr_schema import EHRSchema, check_scaling
from lightning_dprobust.data.ehr_synthetic import GENDERS, MEDICAL, RACES, synthetic_records
from lightning_dprobust.data.splits import check_fraction, split_groups

SOURCES = ("synthetic", "csv", "mimic_iv_ed")
STATIC_CONTINUOUS = ("start_time", "age")
STATIC_CATEGORICAL = {"gender": GENDERS, "race": RACES}
PRIVACY_UNITS = {
    "synthetic": ehr_synthetic.PRIVACY_UNIT,
    "csv": ehr_csv.PRIVACY_UNIT,
    "mimic_iv_ed": ehr_mimic.PRIVACY_UNIT,
}


class EHRDataModule(L.LightningDataModule):
    """EHR records as ``(x, m)`` pairs of float tensors ``[num_steps + 1, F]`` in ``[0, 1]`` (default ``[51, 9]``).

    Step 0 holds the static features (continuous ones min-max scaled, discrete ones one-hot, zero padding to ``F``);
    steps ``1..num_steps`` the temporal ones, feature 0 being the min-max scaled time increment (0 at the first step).
    ``m`` is 1 where a value was observed; ``x`` is 0 where ``m`` is 0, and records are zero-padded (``m = 0``) or
    truncated to ``num_steps``. :attr:`schema` says what each slot means and maps tensors back to raw units.

    Sources:

    * ``"synthetic"`` (default): :func:`~lightning_dprobust.data.ehr_synthetic.synthetic_records`, an embedded
      generator with known structure (``num_records`` records, seed ``synthetic_seed``), F = 9.
    * ``"csv"``: a long-format CSV ``patient, time, feature, value`` (+ static columns) at ``csv_path``
      (:func:`~lightning_dprobust.data.ehr_csv.read_long_csv`).
    * ``"mimic_iv_ed"``: PhysioNet MIMIC-IV-ED's ``edstays.csv``, ``triage.csv`` and ``vitalsign.csv`` in
      ``data_dir`` (credentialed; never shipped), F = 9 (:func:`~lightning_dprobust.data.ehr_mimic.read_mimic_iv_ed`).

    Scaling (``scaling``; design, contract 12): ``"public"`` (default) scales every feature with a declared range:
    ``ranges``, else the source's (:func:`~lightning_dprobust.data.ehr_synthetic.declared_ranges`,
    :data:`~lightning_dprobust.data.ehr_mimic.DECLARED_RANGES`; a CSV has none, so it needs ``ranges`` for every
    scaled feature and ``categories`` for every discrete column). ``"train"`` is the thesis's preprocessing: features
    without a given range take the training split's min/max (a CSV's categories those seen there), which reads the
    private records outside any DP mechanism; ``schema.data_derived`` names them, IGAMT and its baselines refuse them
    under ``strict_dp`` and otherwise report a nominal epsilon.

    Privacy unit (``schema.privacy_unit``): one record. Synthetic and CSV records are one patient each; MIMIC-IV-ED
    records are **per ED stay**, so a patient with ``k`` stays is covered only at group size ``k``.

    Guarantees: the split is by patient (no patient in two splits), a deterministic function of ``seed``. With
    ``scaling="public"`` a training record's tensor is a function of that record alone (adding or removing another
    record changes it in no way) and the schema does not depend on the data. With ``scaling="train"`` the scalers
    come from the training split only (validation and test records never change them) but every training tensor
    depends on the other training records' extremes.

    Args:
        source: one of ``"synthetic"``, ``"csv"``, ``"mimic_iv_ed"``.
        data_dir: MIMIC-IV-ED folder (default ``$DPROBUST_DATA/mimic_iv_ed``).
        csv_path: the long-format CSV file of ``source="csv"``.
        features: the order of the CSV's temporal features (default: their order of first appearance).
        num_steps: temporal steps per record (the thesis's 50).
        num_records: records of the synthetic source.
        synthetic_seed: seed of the synthetic generator (fixed, so every training seed sees the same data).
        ranges: public ``(low, high)`` by feature name (``"time_increment"``, ``"age"``, ...), taking precedence over
            the source's declared ranges (``"public"``) or the training min/max (``"train"``).
        categories: public categories of the CSV's discrete static columns, by column (with ``scaling="train"``,
            default: those seen in the training split).
        scaling: ``"public"`` (declared ranges only) or ``"train"`` (the thesis's training min/max; not DP).
        val_fraction: fraction of the records (whole patients) held out for validation.
        test_fraction: fraction of the records (whole patients) held out for testing.
        batch_size: training batch size (with ``DPCallback``: the expected Poisson batch size).
        eval_batch_size: batch size of the validation and test loaders.
        num_workers: data loader worker processes.
        seed: seed of the split and of the shuffling.

    Example:
        >>> datamodule = EHRDataModule(num_records=40)
        >>> x, m = next(iter(datamodule.train_dataloader()))
        >>> tuple(x.shape[1:]), datamodule.schema.feature_names[0], datamodule.schema.one_hot_groups["gender"]
        ((51, 9), 'time_increment', range(2, 4))
    """

    name = "ehr"

    def __init__(
        self,
        source: str = "synthetic",
        data_dir: str | None = None,
        csv_path: str | None = None,
        features: list[str] | None = None,
        num_steps: int = 50,
        num_records: int = 2000,
        synthetic_seed: int = 0,
        ranges: Mapping[str, tuple[float, float]] | None = None,
        categories: Mapping[str, list[str]] | None = None,
        scaling: str = "public",
        val_fraction: float = 0.1,
        test_fraction: float = 0.1,
        batch_size: int = 64,
        eval_batch_size: int = 256,
        num_workers: int = 0,
        seed: int = 0,
    ) -> None:
        super().__init__()
        if source not in SOURCES:
            raise ValueError(f"source={source!r} is not one of {SOURCES}: set --data.source to one of them")
        if source == "csv" and csv_path is None:
            raise ValueError("source='csv' needs the file: set --data.csv_path to a long-format CSV")
        if (features is not None or categories) and source != "csv":
            raise ValueError(
                f"features and categories describe a CSV's columns, but source={source!r} has fixed ones: drop them"
            )
        if num_steps < 1 or batch_size < 1 or eval_batch_size < 1:
            raise ValueError(
                f"num_steps={num_steps}, batch_size={batch_size}, eval_batch_size={eval_batch_size}: each must be >= 1"
            )
        check_fraction("val_fraction", val_fraction)
        check_fraction("test_fraction", test_fraction)
        self.source, self.csv_path, self.features, self.num_steps = source, csv_path, features, num_steps
        self.data_dir = resolve_data_dir(data_dir, "mimic_iv_ed")
        self.num_records, self.synthetic_seed = num_records, synthetic_seed
        self.ranges = dict(ranges or {})
        self.categories = dict(categories or {})
        self.scaling = check_scaling(scaling)
        self.val_fraction, self.test_fraction = val_fraction, test_fraction
        self.batch_size, self.eval_batch_size = batch_size, eval_batch_size
        self.num_workers, self.seed = num_workers, seed
        self.records: dict[str, list[RawRecord]] = {}
        self.train_set: TensorDataset | None = None
        self.val_set: TensorDataset | None = None
        self.test_set: TensorDataset | None = None
        self._schema: EHRSchema | None = None

    @property
    def schema(self) -> EHRSchema:
        """The layout, scalers and privacy unit (reads and splits the data on first use)."""
        self.setup()
        assert self._schema is not None
        return self._schema

    @property
    def num_features(self) -> int:
        return self.schema.num_features

    @override
    def setup(self, stage: str | None = None) -> None:
        if self._schema is not None:
            return
        records, medical, continuous, categorical = self._read()
        groups = [record.group for record in records]
        n = len(records)
        targets = [max(1, round(self.test_fraction * n)), max(1, round(self.val_fraction * n))]
        test, val, train = split_groups(groups, targets, self.seed)
        self.records = {
            name: [records[i] for i in index] for name, index in (("train", train), ("val", val), ("test", test))
        }
        scaled = ("time_increment", *medical, *continuous)
        ranges = {**{k: v for k, v in self._declared_ranges().items() if k in scaled}, **self.ranges}
        schema = fit_schema(
            self.records["train"],
            medical,
            continuous,
            categorical,
            self.num_steps,
            ranges,
            scaling=self.scaling,
            privacy_unit=PRIVACY_UNITS[self.source],
        )
        self.train_set, self.val_set, self.test_set = (
            TensorDataset(*encode(self.records[name], schema)) for name in ("train", "val", "test")
        )
        self._schema = schema

    def _declared_ranges(self) -> dict[str, tuple[float, float]]:
        """The source's public ranges under ``scaling="public"`` (none for a CSV); none under ``"train"``."""
        if self.scaling != "public" or self.source == "csv":
            return {}
        return ehr_synthetic.declared_ranges() if self.source == "synthetic" else dict(ehr_mimic.DECLARED_RANGES)

    def _read(self) -> tuple[list[RawRecord], tuple[str, ...], tuple[str, ...], dict]:
        """All records, the medical feature names, the continuous and the categorical static features."""
        if self.source == "synthetic":
            records = synthetic_records(self.num_records, self.synthetic_seed)
            return records, MEDICAL, STATIC_CONTINUOUS, dict(STATIC_CATEGORICAL)
        if self.source == "mimic_iv_ed":
            records, continuous = read_mimic_iv_ed(self.data_dir)
            return records, VITALS, continuous, dict(STATIC_CATEGORICAL)
        table = read_long_csv(self.csv_path, self.features)
        unknown = sorted(set(self.categories) - set(table.categorical))
        if unknown:
            raise ValueError(f"categories for {unknown}: not a discrete static column of {self.csv_path}")
        categorical = {name: self.categories.get(name) for name in table.categorical}
        return table.records, table.medical, table.continuous, categorical

    @override
    def train_dataloader(self) -> DataLoader:
        self.setup()
        generator = torch.Generator().manual_seed(self.seed)
        return DataLoader(
            self.train_set, batch_size=self.batch_size, shuffle=True, generator=generator, num_workers=self.num_workers
        )

    @override
    def val_dataloader(self) -> DataLoader:
        self.setup()
        return DataLoader(self.val_set, batch_size=self.eval_batch_size, num_workers=self.num_workers)

    @override
    def test_dataloader(self) -> DataLoader:
        self.setup()
        return DataLoader(self.test_set, batch_size=self.eval_batch_size, num_workers=self.num_workers)


def check_ehr_batch(x: Tensor, m: Tensor, schema: EHRSchema) -> None:
    """Raise ``ValueError`` naming the problem unless ``(x, m)`` is a valid preprocessed EHR batch for ``schema``.

    Valid: float tensors of shape ``[B, num_steps + 1, F]``, values in ``[0, 1]``, ``m`` binary, ``x`` 0 where ``m``
    is 0.
    """
    expected = schema.shape
    if x.shape != m.shape or x.dim() != 3 or tuple(x.shape[1:]) != expected:
        raise ValueError(
            f"EHR batch x {tuple(x.shape)} and m {tuple(m.shape)}: both must be [B, {expected[0]}, {expected[1]}] "
            "(start step + num_steps steps, F features); use the data module the model was built for"
        )
    if not (x.is_floating_point() and m.is_floating_point()):
        raise ValueError(f"EHR batch dtypes {x.dtype} and {m.dtype}: x and m must be float tensors")
    if not torch.isfinite(x).all() or x.min() < 0 or x.max() > 1:
        raise ValueError("EHR values must be finite and in [0, 1]: scale them with the schema's ranges")
    if ((m != 0) & (m != 1)).any():
        raise ValueError("EHR mask values must be 0 (missing) or 1 (observed)")
    if (x[m == 0] != 0).any():
        raise ValueError("EHR values must be 0 where the mask is 0 (missing values are replaced by 0)")
