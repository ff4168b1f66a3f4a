#!/usr/bin/env bash
# Fault injection against `dstwin serve` and the commands that write files: not part of CI (it
# takes about a minute, opens a thousand sockets and needs python3 and curl), a check to run
# after touching the server, its limits or the output code (docs/robustness.md). Each fault
# prints one line, "held" or "FAILED" with what was seen; the exit status is the number of
# faults that did not hold.
#
#   cargo build --release && tests/fault-injection.sh
#   DSTWIN=/path/to/dstwin PORT=8031 tests/fault-injection.sh
#
# Faults: a flood of idle connections (the server must keep answering, and close them after
# --header-timeout), a slow client sending its headers a byte at a time, a body announced but
# never sent (408 after --body-timeout), a full disk under the file outputs and standard
# output, and a device that fails (a step priced over a day): the request in flight gets 500
# and the process exits 1.
set -uo pipefail
cd "$(dirname "$0")/.."

BIN=${DSTWIN:-target/release/dstwin}
PORT=${PORT:-8031}
URL="http://127.0.0.1:$PORT"
WORK=$(mktemp -d)
failed=0
server=
trap '[[ -n $server ]] && kill "$server" 2>/dev/null; umount "$WORK/full" 2>/dev/null; rm -rf "$WORK"' EXIT

verdict() { # NAME OK DETAIL
    if [[ $2 == 1 ]]; then
        printf 'held    %-34s %s\n' "$1" "$3"
    else
        printf 'FAILED  %-34s %s\n' "$1" "$3"
        failed=$((failed + 1))
    fi
}

start() { # ARGS...: a server on PORT, waited for
    "$BIN" serve "$@" --port "$PORT" >"$WORK/serve.log" 2>&1 &
    server=$!
    for _ in $(seq 200); do
        curl -sf "$URL/health" >/dev/null 2>&1 && return 0
        sleep 0.05
    done
    echo "the server did not start: $(tail -3 "$WORK/serve.log")" >&2
    exit 1
}

stop() {
    kill "$server" 2>/dev/null
    wait "$server" 2>/dev/null
    server=
}

complete() { # [PROMPT_TOKENS]: a one-token completion; prints the HTTP status
    local ids
    ids=$(python3 -c "import sys; print(','.join(['7'] * int(sys.argv[1])))" "${1:-3}")
    curl -s -o /dev/null -w '%{http_code}' -m 10 "$URL/v1/completions" \
        -H 'Content-Type: application/json' \
        -d "{\"model\":\"deepseek-v3.1\",\"prompt\":[$ids],\"max_tokens\":1}"
}

# 1-3: connections. A short header timeout so that the run stays short.
start --time-scale 0 --header-timeout 2 --body-timeout 2 --max-connections 900
python3 - "$PORT" >"$WORK/flood" <<'EOF' &
import socket, sys, time
port = int(sys.argv[1])
socks = []
for _ in range(1000):
    try:
        socks.append(socket.create_connection(("127.0.0.1", port), timeout=1))
    except OSError:
        break
time.sleep(4)
closed = 0
for s in socks:
    s.settimeout(0.01)
    try:
        if s.recv(1) == b"":
            closed += 1
    except socket.timeout:
        pass
    except OSError:
        closed += 1
print(len(socks), closed)
EOF
flood=$!
sleep 1
code=$(complete)
verdict "served during an idle flood" "$([[ $code == 200 ]] && echo 1)" "a completion while idle sockets pile up: HTTP $code"
wait "$flood"
read -r opened closed <"$WORK/flood"
verdict "idle connections closed" "$([[ $closed -ge $((opened * 9 / 10)) ]] && echo 1)" \
    "$closed of $opened closed within 4 s (--header-timeout 2)"

slow=$(python3 - "$PORT" <<'EOF'
import socket, sys, time
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
t0 = time.time()
try:
    for b in b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n":
        s.send(bytes([b]))
        time.sleep(0.2)
    print("never closed")
except OSError:
    print("closed after %.1f s" % (time.time() - t0))
EOF
)
verdict "headers a byte at a time" "$([[ $slow == closed* ]] && echo 1)" "$slow (--header-timeout 2)"

body=$(python3 - "$PORT" <<'EOF'
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=10)
s.send(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
       b"Content-Length: 1000000\r\n\r\n{")
print((s.recv(200).split(b"\r\n")[0] or b"closed").decode())
EOF
)
verdict "a body that never comes" "$([[ $body == *408* ]] && echo 1)" "$body (--body-timeout 2)"
stop

# 4: a full disk. Every output is written beside its target and renamed, so a failed write
# exits 1 and leaves nothing under the target's name. A full filesystem is a tmpfs of 256 kB
# filled up (needs root to mount; skipped otherwise); standard output is /dev/full.
full="$WORK/full"
mkdir -p "$full"
if mount -t tmpfs -o size=256k tmpfs "$full" 2>/dev/null; then
    dd if=/dev/zero of="$full/fill" bs=4k 2>/dev/null
    for out in --requests-csv --timeline; do
        "$BIN" simulate --quiet "$out" "$full/out" >/dev/null 2>"$WORK/err"
        code=$?
        left=$(find "$full" -mindepth 1 ! -name fill | wc -l)
        verdict "full disk: simulate $out" "$([[ $code == 1 && $left == 0 ]] && echo 1)" \
            "exit $code, $left files left: $(head -c 80 "$WORK/err")"
    done
    "$BIN" init-weights --preset tiny --seed 1 --out "$full/m" >/dev/null 2>"$WORK/err"
    code=$?
    left=$(find "$full" -type f ! -name fill | wc -l)
    verdict "full disk: init-weights" "$([[ $code == 1 && $left == 0 ]] && echo 1)" \
        "exit $code, $left files left: $(head -c 80 "$WORK/err")"
    umount "$full"
else
    printf 'skipped %-34s %s\n' "full disk: file outputs" "(mounting a tmpfs needs root)"
fi
"$BIN" simulate --quiet >/dev/full 2>"$WORK/err"
code=$?
verdict "full disk: standard output" "$([[ $code == 1 ]] && echo 1)" "exit $code: $(head -c 80 "$WORK/err")"

# 5: a device that fails. A chip at the slowest figures a file may give prices the first
# 4,000-token prompt at days: the twin refuses the step, and the server must say so and stop.
sed 's/^chip = "ascend-910c"/chip = { name = "slow", vendor = "v", dies_per_package = 2, peak_tflops = { bf16 = 0.001, int8 = 0.001 }, hbm_gb = 64, hbm_tb_s = 0.001, source = "s" }/' \
    hwmodels/data/systems/atlas-800-a3.toml >"$WORK/slow.toml"
start --time-scale 0 --set "hardware=$WORK/slow.toml"
code=$(complete 4000)
verdict "device failure: request in flight" "$([[ $code == 500 ]] && echo 1)" "HTTP $code"
# The server stops by itself (its /health 503 and gauges at 0 before it goes are checked by
# tests/echo_device.rs; here the process is gone too soon to ask).
for _ in $(seq 50); do
    kill -0 "$server" 2>/dev/null || break
    sleep 0.1
done
if kill -0 "$server" 2>/dev/null; then
    kill -9 "$server"
    wait "$server" 2>/dev/null
    code="none (still running after 5 s: killed)"
else
    wait "$server"
    code=$?
fi
server=
verdict "device failure: the server stops" \
    "$([[ $code == 1 ]] && grep -q 'a device failed' "$WORK/serve.log" && echo 1)" \
    "exit $code: $(grep -m1 'device failed' "$WORK/serve.log" | head -c 80)"

exit "$failed"
