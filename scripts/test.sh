#!/usr/bin/env bash
# Install everything, start the services, run every check and the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."

python3 -m pip install --quiet --disable-pip-version-check -e '.[dev]'
# The dashboard's browser tests drive a system Chromium through Playwright
# (whose own browser download needs the internet): Debian's, where apt can
# install it. Without it those tests are skipped, and the rest runs. The
# suites' PgBouncer cases start Debian's pgbouncer themselves: here it must
# be there (CONVEYOR_REQUIRE_PGBOUNCER turns their skip into a failure).
missing=()
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v pgbouncer >/dev/null 2>&1 || missing+=(pgbouncer)
if [ "${#missing[@]}" -gt 0 ] && command -v apt-get >/dev/null 2>&1; then
    { apt-get update -qq && apt-get install -y -qq "${missing[@]}" >/dev/null; } \
        || echo "warning: could not install ${missing[*]}: their tests will skip or fail"
fi
export CONVEYOR_REQUIRE_PGBOUNCER=1
bash scripts/services.sh

echo "== ruff";         python3 -m ruff check src tests benchmarks examples tools
echo "== ruff format";  python3 -m ruff format --check src tests benchmarks examples tools
echo "== mypy";         python3 -m mypy
echo "== import-linter"; lint-imports --no-cache
# The suite runs in two processes (pytest-xdist), but for the chaos smoke
# runs, which start worker processes of their own (and restart the shared
# PostgreSQL server): those run after, one at a time. Arguments name what
# to run instead, in one process.
if [ "$#" -gt 0 ]; then
    echo "== pytest";   python3 -m pytest "$@"
else
    echo "== pytest (two processes)"
    python3 -m pytest -n 2 -p no:benchmark --ignore=tests/chaos \
        --ignore=tests/conformance/test_state_machine.py
    # The state machines on their own: their derandomized draws were seen to
    # differ when they ran among the rest of the suite.
    echo "== pytest (state machines)"
    python3 -m pytest -p no:benchmark tests/conformance/test_state_machine.py
    echo "== pytest (chaos smoke)"
    python3 -m pytest tests/chaos
fi

# The worker starts attempts eagerly on Python 3.12+ (asyncio's eager_start):
# where the machine has such a Python, the worker suite runs on it too, in a
# venv of their own (the backends' suites do not run a worker).
newer_python() {
    for candidate in python3.13 python3.12 \
        $(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.1[2-9]*/bin/python 2>/dev/null); do
        if "$candidate" -c 'import sys; assert sys.version_info >= (3, 12)' 2>/dev/null; then
            echo "$candidate"
            return 0
        fi
    done
    return 1
}
if newer=$(newer_python); then
    echo "== pytest on $("$newer" --version) (worker)"
    "$newer" -m venv .venv-newer
    .venv-newer/bin/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
    # The eager start is the worker's, whatever the store: the suites of the
    # worker's core, its shutdown, its completions, hand-offs (attempts an
    # enqueue started), progress and composition (what an attempt's end
    # writes), on the SQL and in-process stores, keep the stage short.
    .venv-newer/bin/python -m pytest -q -p no:cacheprovider -p no:benchmark -n 2 \
        tests/worker/test_worker.py tests/worker/test_stopping.py \
        tests/worker/test_completer.py tests/worker/test_handoffs.py \
        tests/worker/test_progress.py tests/worker/test_composition.py -k "not redis"
else
    echo "== no Python 3.12+ on this machine: the eager start of attempts is not tested"
fi
