#!/usr/bin/env bash
# Reference receipts of this machine kind (issue 37): one small run of each framework on Fashion-MNIST
# (2,048 training and 512 test images, 2 epochs, seed 3: 128 steps), its receipt signed with a fresh
# Ed25519 key, written to tests/receipts/<isa>/<framework>/ (receipt.json, receipt.sig) with the public key
# in tests/receipts/<isa>/signing-key.pub. <isa> is avx512 where the CPU has avx512f, else avx2. The
# private key is made in a temporary directory and discarded: the receipts are fixtures, signed once.
#   scripts/make-reference-receipts.sh            refuses to replace receipts already there
#   scripts/make-reference-receipts.sh --replace  replaces them (a deliberate, documented change)
# Needs `make setup` and Debian's dataset-fashion-mnist (or data/fashion_mnist from `make train`).
set -euo pipefail
cd "$(dirname "$0")/.."
REPROCUBE=${REPROCUBE:-.venv/bin/reprocube}
CONFIG=(dataset=fashion_mnist data.train_limit=2048 data.test_limit=512 epochs=2 seed=3 log.progress=false)

isa=avx2
grep -qw avx512f /proc/cpuinfo && isa=avx512
target=${RECEIPTS_DIR:-tests/receipts}/$isa  # RECEIPTS_DIR: elsewhere (a trial run)
if [ -e "$target" ] && [ "${1:-}" != "--replace" ]; then
  echo "$target exists: pass --replace to make its receipts again" >&2
  exit 2
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$REPROCUBE" download dataset=fashion_mnist data_dir="$work/data" data.source_dir=/usr/share/datasets/fashion-mnist
made=$work/receipts
mkdir -p "$made"
for framework in pytorch tensorflow jax; do
  start=$SECONDS
  "$REPROCUBE" train framework=$framework "${CONFIG[@]}" data_dir="$work/data" output_dir="$work/runs" \
    run_name=$framework >/dev/null
  if [ ! -e "$work/key.pem" ]; then new_key=--new-key; else new_key=; fi
  "$REPROCUBE" sign "$work/runs/$framework" --key "$work/key.pem" $new_key
  mkdir -p "$made/$framework"
  cp "$work/runs/$framework/receipt.json" "$work/runs/$framework/receipt.sig" "$made/$framework/"
  echo "$framework: $((SECONDS - start)) s"
done
cp "$work/key.pem.pub" "$made/signing-key.pub"
rm -rf "$target"
mkdir -p "$(dirname "$target")"
cp -r "$made" "$target"
echo "written: $target ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs))"
