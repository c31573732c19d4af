#!/usr/bin/env bash
# Container entrypoint of a conveyor worker.
#
#   CONVEYOR_URL   the store (required), e.g. postgresql://app@db:5432/app
#   CONVEYOR_APP   the App to serve, MODULE:ATTR (required), e.g. myproject.tasks:app
#   WORKER_GRACE   seconds a SIGTERM lets running tasks finish (default 30)
#
# Extra arguments go to `conveyor worker` (e.g. --concurrency 20 --queues mail).
set -euo pipefail

: "${CONVEYOR_URL:?set CONVEYOR_URL to the store}"
: "${CONVEYOR_APP:?set CONVEYOR_APP to MODULE:ATTR}"

# Create or upgrade the store's schema: idempotent, and safe when several
# workers start at once.
conveyor migrate

# exec: the worker replaces this shell and receives the container's SIGTERM
# itself. Without exec, the shell would get the signal instead, the worker
# would never hear it, and the runtime's SIGKILL would end it mid-task.
exec conveyor worker "$CONVEYOR_APP" --url "$CONVEYOR_URL" --grace "${WORKER_GRACE:-30}" --log-format json "$@"
