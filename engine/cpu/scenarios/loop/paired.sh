#!/usr/bin/env bash
# The twin-fidelity loop on the CPU engine, paired (docs/validation.md, "The CPU engine, end to
# end"): for each repetition and each workload, profile the engine on the calibration workload,
# serve and measure the workload, profile the calibration workload again, fit the twin to both
# traces and compare the measurement with the twin's prediction. A shared machine's speed drifts
# over minutes, so each measurement gets its own calibration, and two that bracket it in time:
# their fit is the machine's speed averaged over the measurement's span (a steady drift cancels).
# BRACKET=0 profiles before the measurement only, as the loop did first. The summary gives, per
# workload and figure, the median error over the repetitions and its range.
#
# Usage: engine/cpu/scenarios/loop/paired.sh OUT_DIR [REPS] [WORKLOAD...] (REPS 0: only the
# summary of the runs already in OUT_DIR)
# Environment: DSTWIN (the binary; default target/release/dstwin), MODEL (a checkpoint
# directory; default: `init-weights --preset tiny --seed 1` into OUT_DIR/m), PORT (8000),
# SERVE_CPU and BENCH_CPU (the cores for `taskset`; default 1 and 0), CALIBRATE (the calibration
# workload; default calibrate.toml beside this script), BRACKET (1, the default: profile the
# calibration workload before and after each measurement; 0: before only), KEEP_TRACES (1: keep
# each calibration's traces beside its fitted files, some 40 MB each, to fit them again later).
# Needs: taskset, curl, a release build. Run from the repository root.
set -euo pipefail

out=${1:?usage: paired.sh OUT_DIR [REPS] [WORKLOAD...]}
reps=${2:-3}
shift $(($# >= 2 ? 2 : $#))
workloads=("$@")
[ ${#workloads[@]} -gt 0 ] || workloads=(mixed-low mixed-high mixed-saturated prefix pd)
bin=${DSTWIN:-target/release/dstwin}
port=${PORT:-8000}
loop=engine/cpu/scenarios/loop
cal=${CALIBRATE:-$loop/calibrate.toml}
mkdir -p "$out"
model=${MODEL:-$out/m}
[ -f "$model/config.json" ] || "$bin" init-weights --preset tiny --seed 1 --out "$model" > /dev/null

serve() { # scenario [extra args]
    taskset -c "${SERVE_CPU:-1}" "$bin" serve "$1" --device cpu --model "$model" \
        --engine-threads 1 --port "$port" "${@:2}" > "$out/serve.log" 2>&1 &
    server=$!
    for _ in $(seq 100); do
        curl -s -o /dev/null "http://127.0.0.1:$port/health" && return 0
        sleep 0.2
    done
    echo "the server did not start: $out/serve.log" >&2
    exit 1
}
stop() { kill "$server"; wait "$server" 2> /dev/null || true; }
bench() { # scenario result
    taskset -c "${BENCH_CPU:-0}" "$bin" bench-serve --url "http://127.0.0.1:$port" \
        --scenario "$1" --set "model=$model/config.json" --save-result "$2" > "$out/bench.log"
}

profile() { # before|after: the calibration workload, profiled
    serve "$cal" --profile "$out/trace.$1.json"
    bench "$cal" "$out/calibrate.$1.json"
    stop
}

for r in $(seq "$reps"); do
    for w in "${workloads[@]}"; do
        profile before
        serve "$loop/$w.toml"
        bench "$loop/$w.toml" "$out/$w.$r.json"
        stop
        traces=("$out/trace.before.json")
        benches=("$out/calibrate.before.json")
        if [ "${BRACKET:-1}" = 1 ]; then
            profile after
            traces+=("$out/trace.after.json")
            benches+=("$out/calibrate.after.json")
        fi
        "$bin" calibrate --trace "${traces[@]}" --hardware engine/cpu/hardware/cpu-host.toml \
            --dtype fp32 --model "$model" --objective total --bench "${benches[@]}" \
            --out "$out/cpu-costs.toml" --system-out "$out/cpu.toml" > "$out/calibrate.$w.$r.log"
        "$bin" validate --measured "$out/$w.$r.json" --scenario "$loop/$w.toml" \
            --set "model=$model/config.json" --set "hardware=$out/cpu.toml" > "$out/$w.$r.validate"
        # Keep this run's fitted files for a look afterwards (cpu.toml names cpu-costs.toml).
        mkdir -p "$out/$w.$r.fit"
        cp "$out/cpu.toml" "$out/cpu-costs.toml" "$out/$w.$r.fit/"
        [ "${KEEP_TRACES:-0}" = 1 ] && cp "${traces[@]}" "${benches[@]}" "$out/$w.$r.fit/"
        echo "rep $r $w done" >&2
    done
done

# Per workload and figure: the median error over the repetitions, its range and how many runs
# were within 10% (REPS 0 prints this summary of the runs already in OUT_DIR).
echo "workload          figure             median    min .. max   within 10%   (predicted / measured - 1, %)"
for w in "${workloads[@]}"; do
    for f in mean_ttft_ms p90_ttft_ms mean_tpot_ms output_throughput; do
        cat "$out/$w".*.validate |
            awk -v f="$f" '$2 == f { sub("%", "", $5); print $5 }' |
            sort -g |
            awk -v w="$w" -v f="$f" '{ v[NR] = $1; if ($1 >= -10 && $1 <= 10) k++ }
                END { if (NR == 0) exit;
                      m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2;
                      printf "%-17s %-17s %+7.1f  %+6.1f .. %+6.1f  %3d / %d\n", w, f, m, v[1], v[NR], k, NR }'
    done
done
