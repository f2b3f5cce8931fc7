"""Build step that puts the shipped ``zoo/`` catalog and weights and ``configs/`` into the wheel, under
``lightning_dprobust/_data/``; the top-level folders stay the source of truth (see ``lightning_dprobust.paths``)."""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

SHIPPED = ("zoo", "configs")


class BuildWithShippedData(build_py):
    def run(self) -> None:
        super().run()
        if self.editable_mode:  # an editable install reads the folders in place
            return
        for folder in SHIPPED:
            if Path(folder).is_dir():
                self.copy_tree(folder, str(Path(self.build_lib) / "lightning_dprobust" / "_data" / folder))


setup(cmdclass={"build_py": BuildWithShippedData})
