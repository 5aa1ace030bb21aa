#!/bin/bash
# Where PostgreSQL's time goes, statement by statement, under create + wait load.
#
#   bench/pg/explain.sh [clients] [seconds]
#
# Starts `spindle serve` on a fresh database, has auto_explain log every statement's plan with
# its actual times (through the database's session_preload_libraries: no server restart; needs
# a superuser), runs the load generator, and prints per statement its total, count, mean and
# calls per run, with the trigger time inside it. Timings carry auto_explain's overhead: read
# them as shares, not as CPU. Environment: SPINDLE_BIN, LOADGEN, PG_URL (admin, trust auth),
# PG_LOG (the server's log file, which must be readable here).
set -euo pipefail
C=${1:-16}; D=${2:-4}
HERE=$(cd "$(dirname "$0")" && pwd); ROOT=$(cd "$HERE/../.." && pwd)
BIN=${SPINDLE_BIN:-$ROOT/target/release/spindle}
LOADGEN=${LOADGEN:-$ROOT/target/release/spindle-loadgen}
PG_URL=${PG_URL:-postgres://postgres@127.0.0.1:5432/postgres}
PG_LOG=${PG_LOG:-/var/log/postgresql/postgresql-15-main.log}
DB=spindle_explain_$$
WORK=$(mktemp -d)
SP=
cleanup() {
  [ -n "$SP" ] && kill "$SP" 2>/dev/null && wait "$SP" 2>/dev/null || true
  psql -q "$PG_URL" -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" >/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
DB_URL=${PG_URL%/*}/$DB
PORT=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
serve() {
  "$BIN" serve --port "$PORT" --host 127.0.0.1 --database-url "$DB_URL" > "$WORK/server.log" 2>&1 &
  SP=$!
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:$PORT/ok" >/dev/null && return; sleep 0.2; done
  echo "the server did not start; its log:" >&2; cat "$WORK/server.log" >&2; exit 1
}
psql -q "$PG_URL" -c "CREATE DATABASE $DB" >/dev/null
# A first load migrates the schema and fills the tables a little, unexplained.
serve
"$LOADGEN" --url "http://127.0.0.1:$PORT" --scenario wait --clients "$C" --duration 3 --warmup 0 >/dev/null
kill "$SP"; wait "$SP" 2>/dev/null || true; SP=
for setting in "session_preload_libraries='auto_explain'" "auto_explain.log_min_duration=0" \
    "auto_explain.log_analyze=on" "auto_explain.log_triggers=on" \
    "auto_explain.log_nested_statements=on" "auto_explain.log_format=json"; do
  psql -q "$PG_URL" -c "ALTER DATABASE $DB SET $setting" >/dev/null
done
START=$(stat -c %s "$PG_LOG")
serve
"$LOADGEN" --url "http://127.0.0.1:$PORT" --scenario wait --clients "$C" --duration "$D" --warmup 0 > "$WORK/load.json"
kill "$SP"; wait "$SP" 2>/dev/null || true; SP=
tail -c +$((START + 1)) "$PG_LOG" > "$WORK/plans"
RUNS=$(python3 -c "import json,sys;print(json.load(open(sys.argv[1]))['runs'])" "$WORK/load.json")
python3 "$HERE/explain_totals.py" "$WORK/plans" "$RUNS"
