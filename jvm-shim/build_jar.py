"""Compiles the Scala shim into the UMJoin jar with the Scala compiler inside the installed pyspark.

No sbt, Maven or download: pyspark's wheel ships scala-compiler, scala-library and scala-reflect next
to Spark's jars, so the jar always matches the Spark that loads it. Used by `make build` and by the
package build (setup.py), the only two ways the jar is made.

Usage: python jvm-shim/build_jar.py <output jar>   (with the python whose pyspark the jar is for)
       python jvm-shim/build_jar.py --testkit <UMJoin jar> <output jar>
The testkit jar (jvm-shim/src/test/scala: the cost models asked directly, the arrival replay) is
compiled against the UMJoin jar for the test suite and the benchmarks; it is never installed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCALA_SOURCES = ROOT / "jvm-shim" / "src" / "main" / "scala"
TESTKIT_SOURCES = ROOT / "jvm-shim" / "src" / "test" / "scala"
RULES = ROOT / "rules"
RESOURCES = ROOT / "jvm-shim" / "src" / "main" / "resources"
COMPILER_JARS = ("scala-compiler", "scala-library", "scala-reflect")


class BuildError(Exception):
    """The jar cannot be built; the message says what is missing and how to get it."""


def _spark_jars() -> Path:
    try:
        import pyspark
    except ImportError:
        raise BuildError("pyspark is not installed in this Python; install pyspark==4.3.0 first (it carries Spark's jars "
                         "and the Scala compiler the shim is compiled with)") from None
    return Path(pyspark.__file__).parent / "jars"


def _java() -> str:
    home = os.environ.get("JAVA_HOME")
    candidates = [Path(home) / "bin" / "java"] if home else []
    found = shutil.which("java")
    candidates += [Path(found)] if found else []
    for candidate in candidates:
        if candidate.is_file():
            return str(candidate)
    raise BuildError("no `java` found (JAVA_HOME or PATH): compiling the UMJoin shim needs Java 17 or later, "
                     "e.g. `apt-get install openjdk-17-jdk-headless`")


def source_files() -> list[Path]:
    """Everything the jar is made from: the Scala sources and the rules files it carries."""
    return sorted(SCALA_SOURCES.rglob("*.scala")) + sorted(RULES.glob("*.yaml"))


def build_jar(output: Path, testkit_of: Path | None = None) -> Path:
    """Compiles the shim and writes the jar (classes plus `umjoin/rules/*.yaml`) to ``output``; with
    ``testkit_of`` (the UMJoin jar), compiles the testkit against it instead."""
    spark_jars = _spark_jars()
    compiler_classpath = []
    for name in COMPILER_JARS:
        matches = sorted(spark_jars.glob(f"{name}-2.13.*.jar"))
        if not matches:
            raise BuildError(f"{name}-2.13.*.jar is not in {spark_jars}; the shim needs pyspark==4.3.0, which ships it")
        compiler_classpath.append(str(matches[-1]))
    source_dir = SCALA_SOURCES if testkit_of is None else TESTKIT_SOURCES
    sources = sorted(source_dir.rglob("*.scala"))
    if not sources:
        raise BuildError(f"no Scala sources under {source_dir}; build from a complete checkout or source distribution")
    classpath = str(spark_jars / "*") if testkit_of is None else os.pathsep.join([str(testkit_of), str(spark_jars / "*")])
    with tempfile.TemporaryDirectory(prefix="umjoin-build-") as scratch:
        classes = Path(scratch) / "classes"
        classes.mkdir()
        arguments = Path(scratch) / "sources.txt"
        arguments.write_text("\n".join(str(s) for s in sources) + "\n")
        command = [_java(), "-cp", os.pathsep.join(compiler_classpath), "scala.tools.nsc.Main",
                   "-deprecation", "-feature", "-Wunused:imports", "-Werror",
                   "-classpath", classpath, "-d", str(classes), f"@{arguments}"]
        if subprocess.run(command).returncode != 0:
            raise BuildError("the Scala compiler failed (its messages are above)")
        output.parent.mkdir(parents=True, exist_ok=True)
        partial = output.with_name(output.name + ".tmp")
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as jar:
            jar.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\nCreated-By: umjoin jvm-shim/build_jar.py\n\n")
            for path in sorted(classes.rglob("*")):
                if path.is_file():
                    jar.write(path, path.relative_to(classes).as_posix())
            # The member patterns travel inside the jar: the built-in rules are the ones it was built with.
            for rules in sorted(RULES.glob("*.yaml")) if testkit_of is None else ():
                jar.write(rules, f"umjoin/rules/{rules.name}")
            # Service registrations (the umjoin-state data source's short name).
            for resource in sorted(RESOURCES.rglob("*")) if testkit_of is None else ():
                if resource.is_file():
                    jar.write(resource, resource.relative_to(RESOURCES).as_posix())
        partial.replace(output)
    return output


def main(argv: list[str]) -> int:
    if len(argv) == 1:
        output, testkit_of = Path(argv[0]), None
    elif len(argv) == 3 and argv[0] == "--testkit":
        output, testkit_of = Path(argv[2]), Path(argv[1])
    else:
        print("usage: python jvm-shim/build_jar.py [--testkit <UMJoin jar>] <output jar>", file=sys.stderr)
        return 2
    try:
        print(f"built {build_jar(output, testkit_of)}")
    except BuildError as e:
        print(f"jvm-shim/build_jar.py: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
