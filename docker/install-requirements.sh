#!/bin/sh
# Build step: creates /opt/venv and installs the hash-locked requirements of VARIANT (cpu|gpu), from
# /wheelhouse when it holds files (offline build: wheelhouse/VARIANT of the build context), else from the index.
set -eu
variant=$1
case "$variant" in
  cpu) lock=requirements-cpu.txt ;;
  gpu) lock=requirements.txt ;;
  *) echo "install-requirements.sh: VARIANT must be cpu or gpu, got '$variant'" >&2; exit 2 ;;
esac
python3 -m venv /opt/venv
echo "$lock" > /opt/venv/lock-name
if [ -n "$(find /wheelhouse -type f ! -name .keep 2>/dev/null | head -n 1)" ]; then
  echo "installing $lock offline from wheelhouse/$variant"
  source="--no-index --find-links /wheelhouse"
else
  echo "installing $lock from the index (wheelhouse/$variant is empty)"
  source="--retries 2"
fi
# antlr4-python3-runtime (hydra's parser) is an sdist: it builds with the venv's own setuptools, so
# no build dependency has to be fetched (--no-build-isolation).
# shellcheck disable=SC2086
/opt/venv/bin/pip install --quiet --no-cache-dir --disable-pip-version-check --require-hashes \
  --no-build-isolation $source -r "/src/$lock"
