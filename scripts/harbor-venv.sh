#!/bin/sh
# Make the Harbor virtualenv the Harbor environment's tests run `harbor run` from
# (docs/harbor.md): Harbor needs Python 3.12 or newer, the project's own venv may be older.
# Usage: scripts/harbor-venv.sh VENV   (HARBOR_PYTHON=/path/to/python3.12 to choose one)
set -eu
venv=${1:-.venv-harbor}
here=$(cd "$(dirname "$0")/.." && pwd)

new_enough() {
    "$1" -c 'import sys, venv; sys.exit(0 if sys.version_info >= (3, 12) else 1)' \
        >/dev/null 2>&1
}

find_python() {
    if [ -n "${HARBOR_PYTHON:-}" ]; then
        new_enough "$HARBOR_PYTHON" && { echo "$HARBOR_PYTHON"; return 0; }
        echo "HARBOR_PYTHON=$HARBOR_PYTHON is not a Python 3.12 or newer with venv" >&2
        return 1
    fi
    # On PATH (a pyenv shim for a version not selected fails to run, and is passed over).
    for name in python3.14 python3.13 python3.12 python3; do
        found=$(command -v "$name" 2>/dev/null) || continue
        new_enough "$found" && { echo "$found"; return 0; }
    done
    # pyenv's installed versions, newest first.
    if command -v pyenv >/dev/null 2>&1; then
        root=$(pyenv root 2>/dev/null) || root=
        if [ -n "$root" ] && [ -d "$root/versions" ]; then
            for found in $(ls -d "$root"/versions/*/bin/python3 2>/dev/null | sort -rV); do
                new_enough "$found" && { echo "$found"; return 0; }
            done
        fi
    fi
    # uv's managed Pythons.
    if command -v uv >/dev/null 2>&1; then
        found=$(uv python find '>=3.12' 2>/dev/null) || found=
        [ -n "$found" ] && new_enough "$found" && { echo "$found"; return 0; }
    fi
    return 1
}

python=$(find_python) || {
    echo "no Python 3.12 or newer found (PATH, pyenv, uv): install one, e.g." \
        "'apt-get install python3.12 python3.12-venv' or 'pyenv install 3.12', or set HARBOR_PYTHON" >&2
    exit 1
}
echo "harbor venv: $venv from $python ($("$python" -c 'import platform; print(platform.python_version())'))"
rm -rf "$venv"
"$python" -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check --no-compile -r "$here/scripts/harbor-requirements.txt" -e "$here"
touch "$venv/.installed"
