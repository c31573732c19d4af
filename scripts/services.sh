#!/usr/bin/env bash
# Make sure PostgreSQL and Redis answer on 127.0.0.1; start (or install) them if not.
set -euo pipefail

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

apt_install() {
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "$@" >/dev/null
}

pg_up() { pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; }

if ! pg_up; then
    if ! command -v pg_ctlcluster >/dev/null 2>&1 || [ -z "$(ls /etc/postgresql 2>/dev/null)" ]; then
        echo "services: installing PostgreSQL"
        apt_install postgresql
    fi
    version=$(ls /etc/postgresql | sort -V | tail -n 1)
    echo "services: starting PostgreSQL $version"
    as_root pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
    for _ in $(seq 1 30); do pg_up && break; sleep 1; done
    pg_up || { echo "services: PostgreSQL did not start" >&2; exit 1; }
fi

# The tests connect as the current user over TCP, to database "test".
if ! psql -h 127.0.0.1 -d test -c 'select 1' >/dev/null 2>&1; then
    user=$(id -un)
    as_root su postgres -c "psql -q -c \"do \\\$\\\$ begin
        if not exists (select from pg_roles where rolname = '$user') then
            create role \\\"$user\\\" superuser login; end if; end \\\$\\\$\"" || true
    as_root su postgres -c "createdb -O '$user' test" 2>/dev/null || true
fi

if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
    if ! command -v redis-server >/dev/null 2>&1; then
        echo "services: installing Redis"
        apt_install redis-server
    fi
    echo "services: starting Redis"
    redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no >/dev/null
    for _ in $(seq 1 30); do redis-cli -h 127.0.0.1 ping >/dev/null 2>&1 && break; sleep 0.5; done
fi
