"""benchmarks/ehr_similarity.py: each model's rank per metric, computed by the script from the means."""

from __future__ import annotations

import pytest

from tests.helpers import load_benchmark

ehr = load_benchmark("ehr_similarity")
Sweep = load_benchmark("seeds").Sweep


def _sweep(columns, minkowski, cosine):
    """Two seeds whose means are ``minkowski`` and ``cosine`` on every metric."""
    runs = []
    for shift in (-0.1, 0.1):
        run = {key: (minkowski if key.endswith("minkowski") else cosine) + shift for key in columns}
        runs.append(run | {"epsilon": 3.0})
    return Sweep([0, 1], runs)


def test_ranks_put_lower_minkowski_and_higher_cosine_first_among_the_models_of_a_sigma():
    results = {
        "vae@1": _sweep(ehr.COLUMNS, 7.0, 0.2),
        "igamt@1": _sweep(ehr.COLUMNS, 6.0, 0.1),
        "gan@1": _sweep(ehr.COLUMNS, 6.0, 0.3),
        "igamt via Dec@1": _sweep(ehr.COLUMNS, 1.0, 0.9),  # a diagnostic row: not ranked
        "real_train@1": _sweep(ehr.COLUMNS, 2.0, 0.9),  # the reference: not ranked
        "igamt@2": _sweep(ehr.COLUMNS, 5.0, 0.5),  # alone at its sigma: no ranks
    }
    ranked = ehr.ranks(results)
    assert set(ranked) == {"vae@1", "igamt@1", "gan@1"}
    assert ranked["igamt@1"]["synthetic/minkowski"] == 1  # tied with gan: both take the better rank
    assert ranked["gan@1"]["synthetic/minkowski"] == 1
    assert ranked["vae@1"]["synthetic/feature_7/minkowski"] == 3
    assert [ranked[label]["synthetic/cosine"] for label in ("gan@1", "vae@1", "igamt@1")] == [1, 2, 3]
    rows = ehr.rank_cells(results)
    assert [row[:2] for row in rows] == [["vae", "1"], ["igamt", "1"], ["gan", "1"]]
    assert all(len(row) == len(ehr.RANK_HEADER) for row in rows)
    assert rows[1][2:] == ["1", "3"] * 4


def test_the_real_train_reference_refuses_a_seed_past_the_training_split():
    with pytest.raises(ValueError, match="seed 4 has 0 of 200"):
        ehr.reference_score(4)


def test_the_latent_option_reaches_the_igamt_models():
    assert ehr.build("igamt_w/o_imi", 1.0, 0, latent="per_step").hparams.latent == "per_step"
    assert ehr.build("igamt", 1.0, 0).hparams.latent == "pooled"
    assert ehr.row_label("igamt", 1.0, "strict", latent="per_step") == "igamt (per-step latent)@1"
