"""The synthetic-EHR similarity numbers as a torchmetrics ``Metric``, so a generator's validation loop can accumulate
real and synthetic batches (across processes too) and log the thesis's numbers at the end of an epoch."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from torchmetrics import Metric
from torchmetrics.utilities import dim_zero_cat

from lightning_dprobust.metrics.synthetic import DEFAULT_FEATURES, similarity_report


class SyntheticSimilarity(Metric):
    """Cluster similarity of synthetic to real EHRs (Tang, PhD thesis, Emory University 2021, section 4.3.3).

    Keeps every record it is given (states are concatenated across processes) and computes
    :func:`~lightning_dprobust.metrics.synthetic.similarity_report` on them: lower ``synthetic/minkowski`` and higher
    ``synthetic/cosine`` mean more similar.

    Args:
        features: the temporal features compared one by one.
        n_clusters: clusters of whole records.
        feature_clusters: clusters of one feature's trajectories.
        p: the Minkowski order.
        seed: the k-means seed.
        centred: take cosines around the mean real record.

    Example:
        >>> import torch
        >>> metric = SyntheticSimilarity(features=(0,))
        >>> x, m = torch.rand(8, 3, 2), torch.ones(8, 3, 2)
        >>> metric.update(x, m, x, m)
        >>> round(float(metric.compute()["synthetic/minkowski"]), 6)
        0.0
    """

    is_differentiable: bool = False
    higher_is_better: bool | None = None
    full_state_update: bool = False

    real_x: list[Tensor]
    real_m: list[Tensor]
    synthetic_x: list[Tensor]
    synthetic_m: list[Tensor]

    def __init__(
        self,
        features: Sequence[int] = DEFAULT_FEATURES,
        n_clusters: int = 3,
        feature_clusters: int = 3,
        p: float = 2.0,
        seed: int = 0,
        centred: bool = True,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        self.options = {
            "features": tuple(features),
            "n_clusters": n_clusters,
            "feature_clusters": feature_clusters,
            "p": p,
            "seed": seed,
            "centred": centred,
        }
        for name in ("real_x", "real_m", "synthetic_x", "synthetic_m"):
            self.add_state(name, default=[], dist_reduce_fx="cat")

    def update(self, real_x: Tensor, real_m: Tensor, synthetic_x: Tensor, synthetic_m: Tensor) -> None:
        """Add a batch of real and one of synthetic records, each ``[B, num_steps + 1, F]`` (sizes may differ)."""
        shapes = {tuple(t.shape[1:]) for t in (real_x, real_m, synthetic_x, synthetic_m)}
        if len(shapes) != 1 or real_x.shape != real_m.shape or synthetic_x.shape != synthetic_m.shape:
            raise ValueError(
                f"real {tuple(real_x.shape)}/{tuple(real_m.shape)} and synthetic {tuple(synthetic_x.shape)}/"
                f"{tuple(synthetic_m.shape)}: x and m must match, and every record must have the same [steps, F]"
            )
        self.real_x.append(real_x.detach().float())
        self.real_m.append(real_m.detach().float())
        self.synthetic_x.append(synthetic_x.detach().float())
        self.synthetic_m.append(synthetic_m.detach().float())

    def compute(self) -> dict[str, Tensor]:
        """The report's numbers as scalar tensors."""
        real = dim_zero_cat(self.real_x), dim_zero_cat(self.real_m)
        synthetic = dim_zero_cat(self.synthetic_x), dim_zero_cat(self.synthetic_m)
        report = similarity_report(real, synthetic, **self.options)
        return {key: torch.tensor(value) for key, value in report.items()}
