"""An EHR model whose static layout does not describe its data is refused at fit start, naming the fix."""

from __future__ import annotations

import pytest
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from lightning_dprobust.recipes import CONFIG_DIR, build_recipe
from tests.data.fake_ehr import write_mimic_iv_ed

SHORT = ["--trainer.logger=false", "--trainer.enable_progress_bar=false", "--trainer.callbacks=[]"]


def mimic_recipe(data_dir, *extra):
    """The MIMIC-IV-ED recipe on fake files, writing its run folder under ``data_dir`` (never into the repository)."""
    where = [f"--trainer.default_root_dir={data_dir}/run", f"--data.init_args.data_dir={data_dir}"]
    return build_recipe(
        CONFIG_DIR / "igamt" / "mimic_iv_ed.yaml", [*SHORT, *where, "--data.init_args.batch_size=2", *extra]
    )


def test_mimic_without_patients_csv_is_refused_by_the_age_model(tmp_path):
    cli = mimic_recipe(write_mimic_iv_ed(tmp_path))  # no patients.csv: no age, one continuous static feature
    with pytest.raises(MisconfigurationException, match=r"^IGAMT\(num_features=9, static_continuous=2") as error:
        cli.trainer.fit(cli.model, cli.datamodule)
    message = str(error.value)
    assert "static fields start_time (continuous), gender (2), race (3)" in message
    assert "set num_features=9, static_continuous=1, static_groups=[2, 3]" in message and "\n" not in message


def test_mimic_without_patients_csv_fits_with_one_continuous_static_feature(tmp_path):
    cli = mimic_recipe(
        write_mimic_iv_ed(tmp_path),
        "--model.init_args.static_continuous=1",
        "--trainer.max_epochs=1",
        "--trainer.enable_checkpointing=false",
    )
    cli.trainer.fit(cli.model, cli.datamodule)
    assert cli.model.ledger.steps > 0 and cli.model.ehr_schema is not None
