#!/usr/bin/env bash
# Installs the scientific sandbox's packages (sandbox_images/scientific/requirements.txt) for a given Python
# with the host's pip (`pip install --target`, binary wheels for Debian bookworm's glibc), into
# .build/scientific/site; kept, and redone only when the requirements or the Python change. Both the image
# (scripts/build_images.sh scientific) and the bwrap root filesystem (scripts/build_rootfs.sh scientific) take
# the packages from there, so nothing is downloaded twice.
#
# Usage: scripts/scientific_site.sh PYTHON_VERSION      (e.g. 3.11); prints the site folder
set -euo pipefail
cd "$(dirname "$0")/.."
pyver=${1:?usage: scripts/scientific_site.sh PYTHON_VERSION}
if [ -x .venv/bin/python ]; then PIP=${TITO_PIP:-.venv/bin/python -m pip}; else PIP=${TITO_PIP:-python3 -m pip}; fi
ctx=.build/scientific
stamp="python $pyver; $(sha256sum sandbox_images/scientific/requirements.txt | cut -c1-16)"
if [ "$(cat "$ctx/stamp" 2>/dev/null)" != "$stamp" ]; then
    printf '[scientific] installing the scientific packages for Python %s into %s/site (host pip, binary wheels)\n' "$pyver" "$ctx" >&2
    rm -rf "$ctx" && mkdir -p "$ctx"
    # --platform: manylinux wheels for the image's glibc (Debian bookworm: 2.36).
    $PIP install --quiet --disable-pip-version-check --no-warn-conflicts --target "$ctx/site" \
        --python-version "$pyver" --implementation cp --only-binary=:all: \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -r sandbox_images/scientific/requirements.txt >&2 || { echo "[scientific] ERROR: pip could not install the scientific packages" >&2; exit 1; }
    rm -rf "$ctx/site/bin"
    echo "$stamp" >"$ctx/stamp"
fi
echo "$ctx/site"
