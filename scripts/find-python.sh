#!/bin/sh
# Prints the path of a Python interpreter of the first of the given versions found (e.g. `3.13 3.12`):
# on PATH as pythonX.Y, else under pyenv (whose shims refuse a version that is not selected). Exits 1 if none.
for v in "$@"; do
    for p in "$(command -v "python$v" 2>/dev/null)" \
             "$(pyenv root 2>/dev/null)"/versions/"$v"*/bin/"python$v" \
             "$HOME"/.pyenv/versions/"$v"*/bin/"python$v"; do
        if [ -n "$p" ] && [ -x "$p" ] && "$p" -c 'import sys, venv' >/dev/null 2>&1; then
            echo "$p"
            exit 0
        fi
    done
done
echo "no Python $* found (on PATH or under pyenv); set JAX_PYTHON=/path/to/python3.12 or 3.13" >&2
exit 1
