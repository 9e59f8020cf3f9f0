#!/usr/bin/env bash
# Builds the Python package (bindings/python) once, in release mode, installs
# it into a virtual environment under target/, and runs its pytest suite.
# Installs what it needs itself (the venv, maturin and the test dependencies
# from PyPI). Prints pytest's summary line last.
#
#   scripts/python-test.sh [PYTEST ARGS...]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

venv="${TUBEWAY_VENV:-target/python-venv}"
python="${PYTHON:-python3}"

if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install -q --upgrade pip >/dev/null
"$venv/bin/python" -m pip install -q "maturin>=1.5,<2" "pytest>=7" "pytest-timeout>=2" "numpy>=1.22" "msgpack>=1"

wheels=target/python-wheels
rm -rf "$wheels"
start=$(date +%s)
"$venv/bin/maturin" build --release --locked -q -m bindings/python/Cargo.toml -o "$wheels"
echo "python: extension built in $(($(date +%s) - start)) s"
"$venv/bin/python" -m pip install -q --force-reinstall --no-deps "$wheels"/tubeway-*.whl

# From the tests directory, so `import tubeway` is the installed wheel, not
# the source tree.
cd bindings/python/tests
exec "../../../$venv/bin/python" -m pytest -p no:cacheprovider -q "$@"
