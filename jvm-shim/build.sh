#!/usr/bin/env bash
# Compiles the Scala shim with the Scala compiler shipped inside the installed pyspark wheel,
# so the jar always matches the Spark that loads it (no sbt, Maven or download).
# Usage: jvm-shim/build.sh <python> <output jar>
set -euo pipefail
python=$1
jar_out=$2
root=$(cd "$(dirname "$0")/.." && pwd)
spark_jars=$("$python" -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))')
compiler_cp=""
for name in scala-compiler scala-library scala-reflect; do
  found=$(ls "$spark_jars"/$name-2.13.*.jar 2>/dev/null | head -n 1)
  if [ -z "$found" ]; then
    echo "jvm-shim/build.sh: $name-2.13.*.jar is not in $spark_jars; install pyspark==4.3.0 (make venv)" >&2
    exit 1
  fi
  compiler_cp="$compiler_cp${compiler_cp:+:}$found"
done
classes=$(mktemp -d)
trap 'rm -rf "$classes"' EXIT
find "$root/jvm-shim/src/main/scala" -name '*.scala' > "$classes/sources.txt"
java -cp "$compiler_cp" scala.tools.nsc.Main -deprecation -feature -Wunused:imports -Werror \
  -classpath "$spark_jars/*" -d "$classes" @"$classes/sources.txt"
# The member patterns travel inside the jar: the built-in rules are the ones the jar was built with.
mkdir -p "$classes/umjoin/rules"
cp "$root"/rules/*.yaml "$classes/umjoin/rules/"
rm "$classes/sources.txt"
mkdir -p "$(dirname "$jar_out")"
jar cf "$jar_out.tmp" -C "$classes" .
mv "$jar_out.tmp" "$jar_out"
echo "built $jar_out"
