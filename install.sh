#!/usr/bin/env bash
# Installs everything sparkcep needs on a fresh Debian machine: Java and
# ZooKeeper from Debian packages, the package and its test extras from PyPI.
set -euo pipefail
cd "$(dirname "$0")"
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
if ! command -v java >/dev/null || [ ! -f /usr/share/java/zookeeper.jar ] || ! command -v javac >/dev/null; then
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq openjdk-17-jdk-headless zookeeper numactl >/dev/null
fi
python3 -m pip install -q --disable-pip-version-check -e ".[test]"
# Byte-compile the package: Spark starts fresh Python processes that import it, and where
# PYTHONDONTWRITEBYTECODE is set each of them would otherwise compile it from source again.
python3 -m compileall -q sparkcep pyspark_upmcep >/dev/null
# Compile every kernel the engine uses into numba's cache now: the first run on this machine is
# then as fast as the next ones (cold, each instance manager would compile them for a minute or more).
python3 -m sparkcep warm-up
