"""The package build compiles the Scala shim into the wheel (metadata lives in pyproject.toml).

`pip install .` / `pip wheel .` run jvm-shim/build_jar.py against the pyspark of the build
environment (pyproject.toml's build requirements pin it), so the wheel's jar matches the Spark it
installs. Editable installs (`pip install -e .`, as `make venv` does) leave the jar to `make build`.
"""

import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

sys.path.insert(0, str(Path(__file__).resolve().parent / "jvm-shim"))
from build_jar import RULES, BuildError, build_jar  # noqa: E402


class BuildPyWithJar(build_py):
    """Also compiles the UMJoin jar into the package and copies the rules files it was built with."""

    def run(self) -> None:
        super().run()
        if self.editable_mode:
            return
        package = Path(self.build_lib) / "umjoin"
        try:
            build_jar(package / "jars" / "umjoin-spark.jar")
        except BuildError as e:
            sys.exit(f"umjoin-spark: cannot build the UMJoin jar: {e}")
        # A readable copy of the built-in rules, a starting point for spark.umjoin.rulesDir.
        (package / "rules").mkdir(exist_ok=True)
        for rules in sorted(RULES.glob("*.yaml")):
            self.copy_file(str(rules), str(package / "rules" / rules.name))


setup(cmdclass={"build_py": BuildPyWithJar})
