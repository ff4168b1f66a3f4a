#!/usr/bin/env bash
# Memory of `dstwin serve` over a long run: does it plateau, or does it grow with the requests
# served (a leak)? Starts the server on the default scenario at --time-scale 0 (no waiting),
# drives it with rounds of `dstwin bench-serve` for DURATION seconds, and samples the server's
# resident memory (VmRSS) after every round. Prints one row per sample, then the growth over
# the second half of the run in bytes per request served: a plateau reads as a few bytes per
# request or less (docs/performance.md, "`dstwin serve` memory over time", quotes a run).
#
#   sim/benches/soak.sh                              # one hour, rounds of 5,000 requests
#   DURATION=600 ROUND=2000 sim/benches/soak.sh      # ten minutes
#   DSTWIN=/path/to/dstwin SCENARIO=sim/scenarios/cm384-pd.toml sim/benches/soak.sh
#
# Not a pass/fail test (it takes an hour and its figure depends on the allocator); a release
# build is used (cargo build --release first). PORT (default 8021) is the server's port, which
# must be free. Relative DSTWIN and SCENARIO paths are read from the repository's root.
set -euo pipefail
cd "$(dirname "$0")/../.."

BIN=${DSTWIN:-target/release/dstwin}
DURATION=${DURATION:-3600}
ROUND=${ROUND:-5000}
PORT=${PORT:-8021}
SCENARIO=${SCENARIO:-}
OUT=$(mktemp -d)
server=
trap '[[ -n $server ]] && kill "$server" 2>/dev/null; rm -rf "$OUT"' EXIT
if curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1; then
    echo "port $PORT is taken: set PORT" >&2
    exit 1
fi

"$BIN" serve ${SCENARIO:+"$SCENARIO"} --port "$PORT" --time-scale 0 >"$OUT/serve.log" 2>&1 &
server=$!
for _ in $(seq 200); do
    curl -sf "http://127.0.0.1:$PORT/v1/models" >/dev/null 2>&1 && break
    sleep 0.1
done
if ! kill -0 "$server" 2>/dev/null || ! curl -sf "http://127.0.0.1:$PORT/health" >/dev/null; then
    echo "the server did not start:" >&2
    cat "$OUT/serve.log" >&2
    exit 1
fi
rss_kb() { awk '/^VmRSS:/ { print $2 }' "/proc/$server/status"; }

start=$(date +%s)
served=0
printf '%8s %10s %10s\n' elapsed_s requests rss_kb
printf '%8d %10d %10d\n' 0 0 "$(rss_kb)" | tee "$OUT/samples"
while (($(date +%s) - start < DURATION)); do
    "$BIN" bench-serve --url "http://127.0.0.1:$PORT" --num-prompts "$ROUND" \
        --input-len 256 --output-len 32 --max-concurrency 64 --json -q >"$OUT/round.json"
    done_now=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["completed"])' \
        "$OUT/round.json")
    served=$((served + done_now))
    printf '%8d %10d %10d\n' $(($(date +%s) - start)) "$served" "$(rss_kb)" | tee -a "$OUT/samples"
done

# Growth over the second half: least-squares slope of RSS against requests served.
awk '{ n++; r[n] = $2; m[n] = $3 }
END {
    if (n < 4) { print "too few samples for a slope (raise DURATION or lower ROUND)"; exit }
    h = int(n / 2)
    for (i = h + 1; i <= n; i++) { k++; sx += r[i]; sy += m[i]; sxx += r[i] * r[i]; sxy += r[i] * m[i] }
    slope = (k * sxy - sx * sy) / (k * sxx - sx * sx) * 1024
    printf "RSS %d -> %d kB over %d requests; second half: %+.1f bytes per request\n", m[1], m[n], r[n], slope
}' "$OUT/samples"
