#!/usr/bin/env bash
# Builds the sparkcep SparkPlugin jar against the jars the pyspark wheel ships.
# Usage: jvm-shim/build.sh OUT.jar   (needs javac and jar from a JDK >= 17)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:?usage: build.sh OUT.jar}"
python="${PYTHON:-python3}"
jars="${PYSPARK_JARS:-$("$python" -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))')}"
classes="$(mktemp -d)"
trap 'rm -rf "$classes"' EXIT
javac --release 17 -nowarn -cp "$jars/*" -d "$classes" $(find "$here/src" -name '*.java')
mkdir -p "$(dirname "$out")"
jar cf "$out.tmp.$$" -C "$classes" .
mv -f "$out.tmp.$$" "$out"
echo "$out"
