#!/usr/bin/env bash
# Fetches flash-attn's own test file (tests/test_flash_attn.py), the one pure-Python helper module it
# needs from flash-attn (flash_attn/bert_padding.py) and flash-attn's LICENSE, from flash-attn's
# source distribution on PyPI, plus the einops wheel that those files import, into dev/third_party/
# (ignored by git: their files are never committed to this repository). Run it on a machine that
# reaches PyPI; dev/run_fa_tests.sh then runs that test file against flashattn_ext through the
# adapter in dev/fa_compat/. Carry dev/third_party/ to a machine without network access.
#
#   dev/fetch_flash_attn_tests.sh            # FA_VERSION (default 2.8.3), EINOPS_VERSION (default 0.8.1)
set -euo pipefail

FA_VERSION=${FA_VERSION:-2.8.3}
EINOPS_VERSION=${EINOPS_VERSION:-0.8.1}
root=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-$root/.venv/bin/python}
dest=$root/dev/third_party
src=$dest/flash_attn-$FA_VERSION
site=$dest/site

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# pip prepares an sdist's metadata by running its setup.py; flash-attn's needs torch (hence no build
# isolation, so that it sees this venv's) and skips its CUDA checks with this variable. Nothing is built.
FLASH_ATTENTION_SKIP_CUDA_BUILD=TRUE "$py" -m pip download --quiet --no-deps --no-build-isolation \
    --no-binary :all: "flash-attn==$FA_VERSION" -d "$tmp"
"$py" -m pip download --quiet --no-deps --only-binary :all: "einops==$EINOPS_VERSION" -d "$tmp"

sdist=$tmp/flash_attn-$FA_VERSION.tar.gz
top=flash_attn-$FA_VERSION
rm -rf "$src" "$site"
mkdir -p "$src" "$site"
tar -xzf "$sdist" -C "$tmp" "$top/LICENSE" "$top/tests/test_flash_attn.py" "$top/flash_attn/bert_padding.py"
mkdir -p "$src/tests" "$src/flash_attn"
cp "$tmp/$top/LICENSE" "$src/LICENSE"
cp "$tmp/$top/tests/test_flash_attn.py" "$src/tests/test_flash_attn.py"
cp "$tmp/$top/flash_attn/bert_padding.py" "$src/flash_attn/bert_padding.py"
"$py" -m zipfile -e "$tmp"/einops-"$EINOPS_VERSION"-*.whl "$site"

{
    echo "flash-attn $FA_VERSION sdist sha256 $(sha256sum "$sdist" | cut -d' ' -f1)"
    echo "einops $EINOPS_VERSION"
} > "$dest/SOURCES.txt"
echo "fetched into $dest:"
(cd "$dest" && find . -path ./site -prune -o -type f -print | sort && echo "./site/ (einops $EINOPS_VERSION)")
