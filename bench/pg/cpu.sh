#!/bin/bash
# CPU per run of Spindle and of PostgreSQL under create + wait load: the figures the
# PostgreSQL goals are stated in, for comparing two builds or two schemas quickly.
#
#   bench/pg/cpu.sh [clients] [seconds] [rounds]
#
# Each round starts `spindle serve` on a fresh database, warms it for 2 s, then runs the load
# generator and prints one line: runs/s, p99, and the CPU time per run of the server and of
# every PostgreSQL process (backends that exit meanwhile count through the postmaster's
# children's times). Then the medians over the rounds. Environment: SPINDLE_BIN, LOADGEN,
# PG_URL (admin, trust auth), SCENARIO (default wait), SETUP_SQL (a file run on each fresh
# database after its migrations, before the load: an index to try, a setting),
# SERVE_URL_QUERY (appended to the server's database URL, e.g. `?host=/var/run/postgresql` for
# PostgreSQL's Unix socket).
set -euo pipefail
C=${1:-16}; D=${2:-10}; ROUNDS=${3:-3}
HERE=$(cd "$(dirname "$0")" && pwd); ROOT=$(cd "$HERE/../.." && pwd)
BIN=${SPINDLE_BIN:-$ROOT/target/release/spindle}
LOADGEN=${LOADGEN:-$ROOT/target/release/spindle-loadgen}
PG_URL=${PG_URL:-postgres://postgres@127.0.0.1:5432/postgres}
SCENARIO=${SCENARIO:-wait}
DB=spindle_cpu_$$
export PGOPTIONS=--client-min-messages=warning
WORK=$(mktemp -d)
SP=
cleanup() {
  [ -n "$SP" ] && kill "$SP" 2>/dev/null && wait "$SP" 2>/dev/null || true
  psql -q "$PG_URL" -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT
DB_URL=${PG_URL%/*}/$DB${SERVE_URL_QUERY:-}
TICK=$(getconf CLK_TCK)
PORT=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')

# CPU ticks of one process (user + system), plus its reaped children's when asked.
ticks() { awk -v kids="${2:-0}" '{ t = $14 + $15; if (kids) t += $16 + $17; print t }' \
  "/proc/$1/stat" 2>/dev/null || echo 0; }
postgres_ticks() {
  local total=0 pid master
  master=$(pgrep -o -x postgres)
  for pid in $(pgrep -x postgres); do
    [ "$pid" = "$master" ] && total=$((total + $(ticks "$pid" 1))) \
      || total=$((total + $(ticks "$pid")))
  done
  echo "$total"
}

echo "runs/s p99_ms spindle_ms/run postgresql_ms/run"
for round in $(seq "$ROUNDS"); do
  psql -q "$PG_URL" -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" -c "CREATE DATABASE $DB" >/dev/null
  "$BIN" serve --port "$PORT" --host 127.0.0.1 --database-url "$DB_URL" > "$WORK/server.log" 2>&1 &
  SP=$!
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:$PORT/ok" >/dev/null && break; sleep 0.2; done
  if ! curl -sf "http://127.0.0.1:$PORT/ok" >/dev/null; then
    echo "the server did not start; its log:" >&2; cat "$WORK/server.log" >&2; exit 1
  fi
  [ -n "${SETUP_SQL:-}" ] && psql -q "$DB_URL" -f "$SETUP_SQL" >/dev/null
  "$LOADGEN" --url "http://127.0.0.1:$PORT" --scenario "$SCENARIO" --clients "$C" --duration 2 \
    --warmup 0 > /dev/null
  s0=$(ticks "$SP"); p0=$(postgres_ticks)
  "$LOADGEN" --url "http://127.0.0.1:$PORT" --scenario "$SCENARIO" --clients "$C" \
    --duration "$D" --warmup 0 > "$WORK/load.json"
  s1=$(ticks "$SP"); p1=$(postgres_ticks)
  kill "$SP"; wait "$SP" 2>/dev/null || true; SP=
  python3 - "$WORK/load.json" "$((s1 - s0))" "$((p1 - p0))" "$TICK" <<'EOF' | tee -a "$WORK/rounds"
import json, sys
load = json.load(open(sys.argv[1]))
runs, tick = load["runs"], int(sys.argv[4])
ms = lambda ticks: int(ticks) * 1000 / tick / max(runs, 1)
print(f'{load["runs_per_s"]:.1f} {load["latency_ms"]["p99"]:.1f} '
      f'{ms(sys.argv[2]):.3f} {ms(sys.argv[3]):.3f}')
EOF
done
python3 - "$WORK/rounds" <<'EOF'
import statistics, sys
rows = [list(map(float, line.split())) for line in open(sys.argv[1])]
med = [statistics.median(col) for col in zip(*rows)]
print(f"median of {len(rows)}: {med[0]:.1f} runs/s, p99 {med[1]:.1f} ms, "
      f"Spindle {med[2]:.3f} ms/run, PostgreSQL {med[3]:.3f} ms/run")
EOF
