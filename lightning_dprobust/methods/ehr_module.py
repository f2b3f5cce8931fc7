"""What every EHR generative module (IGAMT and its baselines) keeps besides its networks: the data schema and the
iteration counter, both carried by checkpoints."""

from __future__ import annotations

import dataclasses
from typing import Any

from lightning_dprobust.methods.generative_base import GenerativeDPModule


class EHRGenerativeModule(GenerativeDPModule):
    """A :class:`GenerativeDPModule` trained on EHR tensors.

    ``ehr_schema``: the training data module's ``schema`` as a plain dict, taken at fit start and written to
    checkpoints, so that a release can report synthetic records in raw units. Its scalers are the training split's
    min/max unless the data module was given public ranges: they are not differentially private, and a release saved
    with them carries them. ``iteration``: the training-iteration counter the critic schedule reads; checkpointed, so
    a resumed run keeps the schedule of an unbroken one.
    """

    def __init__(self, **dp_kwargs: Any) -> None:
        super().__init__(**dp_kwargs)
        self.ehr_schema: dict[str, Any] | None = None
        self.iteration = 0

    def on_fit_start(self) -> None:
        super().on_fit_start()
        datamodule = self.trainer.datamodule
        schema = getattr(datamodule, "schema", None) if datamodule is not None else None
        if dataclasses.is_dataclass(schema):
            self.ehr_schema = dataclasses.asdict(schema)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint["igamt_iteration"] = self.iteration
        if self.ehr_schema is not None:
            checkpoint["ehr_schema"] = self.ehr_schema

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        self.iteration = int(checkpoint.get("igamt_iteration", 0))
        self.ehr_schema = checkpoint.get("ehr_schema")
