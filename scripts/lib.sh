# Shared by the scripts in this directory (sourced, not run).
# cormorant_python: the Python interpreter Cormorant is installed into.
#   - the project's .venv if there is one;
#   - else python3 when pip may install into it (pyenv, a virtualenv, a container image);
#   - else (Debian's python3 is "externally managed", PEP 668) a new .venv is created.

CORMORANT_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

cormorant_python() {
    local venv="$CORMORANT_ROOT/.venv"
    if [ -x "$venv/bin/python" ]; then
        echo "$venv/bin/python"
        return
    fi
    local stdlib
    stdlib="$(python3 -c 'import sysconfig; print(sysconfig.get_path("stdlib"))')"
    if [ -e "$stdlib/EXTERNALLY-MANAGED" ] && [ -z "${VIRTUAL_ENV:-}" ]; then
        python3 -m venv "$venv" >&2
        echo "$venv/bin/python"
        return
    fi
    command -v python3
}
