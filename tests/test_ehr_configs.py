"""The IGAMT and EHR-baseline recipes: each instantiates through ``dprobust fit``'s parser with a model that matches
its data (features, steps, static layout), and fits a couple of DP steps when shortened."""

from __future__ import annotations

import math

import pytest

from lightning_dprobust.methods.generative_base import GenerativeDPModule
from lightning_dprobust.recipes import CONFIG_DIR, build_recipe

EHR_CONFIGS = [CONFIG_DIR / "igamt" / "synthetic.yaml", *sorted((CONFIG_DIR / "igamt" / "baselines").glob("*.yaml"))]
SHORT = [
    "--trainer.logger=false",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
    "--trainer.enable_checkpointing=false",
    "--trainer.callbacks=[]",
    "--trainer.max_epochs=1",
    "--trainer.limit_train_batches=2",
    "--data.init_args.num_records=60",
    "--data.init_args.batch_size=16",
    "--data.init_args.num_steps=4",
    "--model.init_args.max_steps=4",
    "--model.init_args.critic_freq_base=1",
]


@pytest.mark.parametrize("config", EHR_CONFIGS, ids=lambda path: path.stem)
def test_ehr_recipes_match_their_data_and_train_with_dp(config, tmp_path):
    cli = build_recipe(config, [*SHORT, f"--trainer.default_root_dir={tmp_path}"])
    module, data = cli.model, cli.datamodule
    assert isinstance(module, GenerativeDPModule) and module.noise_multiplier == 1.0 and module.delta == 1e-5
    data.setup("fit")
    schema, hp = data.schema, module.hparams
    assert (hp.num_features, hp.max_steps) == (schema.num_features, data.num_steps)
    assert hp.static_continuous == len(schema.continuous_static)
    assert list(hp.static_groups) == [len(group) for group in schema.one_hot_groups.values()]
    cli.trainer.fit(module, data)
    assert module.ledger.steps == 2 and 0 < module.epsilon() < math.inf


def test_mimic_recipe_is_igamt_on_the_same_model_as_the_synthetic_one():
    synthetic = build_recipe(EHR_CONFIGS[0], ["--trainer.logger=false"]).model.hparams
    mimic = build_recipe(CONFIG_DIR / "igamt" / "mimic_iv_ed.yaml", ["--trainer.logger=false"]).model.hparams
    assert dict(mimic) == dict(synthetic)


@pytest.mark.slow
def test_demo_ehr_prints_epsilon_and_similarity_and_writes_the_pictures(tmp_path, capsys):
    from lightning_dprobust import demo_ehr

    report = demo_ehr.main(["--out", str(tmp_path), "--max-epochs", "1"])
    printed = capsys.readouterr().out
    assert "privacy:      epsilon" in printed and "overall:      Minkowski" in printed
    assert sorted(path.name for path in tmp_path.glob("*/plots/*.png")) == [
        "missing_values.png",
        "pca.png",
        "time_increments.png",
        "trajectories.png",
    ]
    assert report["synthetic/minkowski"] > 0 and -1 <= report["synthetic/cosine"] <= 1
