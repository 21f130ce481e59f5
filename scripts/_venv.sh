# Sourced by the other scripts: make sure .venv exists with max-softmax
# installed (editable) and its PyPI dependencies, then activate it.
# Re-installs only when pyproject.toml changed since the last install.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
EXTRAS="${VENV_EXTRAS:-test}"  # the extras to install: scripts/bench adds bench
PY="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
  echo "Creating $VENV (first run: installs max, numpy, scipy, pytest from PyPI)..." >&2
  "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
fi
stamp="$VENV/.max-softmax-installed"
want="$(cat "$ROOT/pyproject.toml" | sha256sum | cut -d' ' -f1) $EXTRAS"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  "$VENV/bin/python" -m pip install -q -e "$ROOT[$EXTRAS]"
  echo "$want" > "$stamp"
fi
# shellcheck disable=SC1091
source "$VENV/bin/activate"
cd "$ROOT"
