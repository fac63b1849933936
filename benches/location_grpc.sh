#!/usr/bin/env bash
# The location path through gRPC, this build beside an earlier one in the same minutes: success,
# broker overhead p50 / p99 and the daemon's CPU per request under `cloakd simulate`
# (docs/performance.md, issue 44's figures).
#
#   benches/location_grpc.sh BASE_REV [ROUNDS] [-- simulate options]
#
# BASE_REV is built once in a detached worktree (target dir target/bench-base, kept between runs;
# $BASE_CLOAKD names a release build of it made elsewhere instead);
# this build is target/release/cloakd (or $CLOAKD). Each round starts a fresh daemon of each build in
# turn (which goes first alternates) on its embedded defaults, on loopback port $PORT (default
# 25051), in a temporary directory, and replays the trace against it with the simulator on the same
# machine. Default simulate options: issue 44's run, the Oldenburg 10k trace at 50,000 requests/s.
# Each row also gives the simulator's own CPU per request and what a probe thread beside the run saw
# of the machine's scheduling delay (p99 and longest, see probe() below). And where a request's
# broker overhead is spent: "in daemon" is the daemon's own mean of it (from reading the request off
# its stream to the broker having handled it, `cloakd_location_broker_overhead_seconds` scraped after
# the run), the rest is the two gRPC hops and the simulator; "broker run/wait" is the broker thread's
# time on a core and its time runnable but waiting for one, per request (from
# /proc/PID/task/*/schedstat): a wait near the run time says the 2 cores, not the code, set the pace.
#
#   cargo build --release
#   benches/location_grpc.sh 41db5d7 3
#   benches/location_grpc.sh 41db5d7 3 -- --trace T --limit 100000 --clients 32 --rate 20000 --dx-min 500 --dx-max 500
set -euo pipefail

base_rev=${1:?usage: location_grpc.sh BASE_REV [ROUNDS] [-- simulate options]}
rounds=${2:-3}
shift $(($# >= 2 ? 2 : 1))
if [ "${1:-}" = "--" ]; then shift; fi
repo=$(git rev-parse --show-toplevel)
trace=${TRACE:-$repo/../shared/data/mobility/oldenburg_10k.csv.gz}
if [ $# -eq 0 ]; then
    set -- --trace "$trace" --limit 300000 --clients 32 --rate 50000
fi
# Absolute, since each daemon starts in a directory of its own.
current=$(realpath -m "${CLOAKD:-$repo/target/release/cloakd}")
port=${PORT:-25051}
metrics_port=$((port + 1))
work=$(mktemp -d)
daemon=
prober=

cleanup() {
    if [ -n "$daemon" ]; then kill -9 "$daemon" 2>/dev/null || true; fi
    if [ -n "$prober" ]; then kill "$prober" 2>/dev/null || true; fi
    git -C "$repo" worktree remove --force "$work/base" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

[ -x "$current" ] || { echo "no $current: cargo build --release first" >&2; exit 1; }
base_sha=$(git -C "$repo" rev-parse --short "$base_rev")
if [ -n "${BASE_CLOAKD:-}" ]; then
    base=$(realpath -m "$BASE_CLOAKD") # a release build of BASE_REV made elsewhere
    [ -x "$base" ] || { echo "no $base (BASE_CLOAKD)" >&2; exit 1; }
else
    git -C "$repo" worktree add --quiet --detach "$work/base" "$base_sha"
    echo "building $base_sha (target/bench-base) ..." >&2
    (cd "$work/base" && CARGO_TARGET_DIR="$repo/target/bench-base" cargo build --release --quiet --bin cloakd)
    base="$repo/target/bench-base/release/cloakd"
fi
current_sha=$(git -C "$repo" rev-parse --short HEAD)$(git -C "$repo" diff --quiet HEAD -- src || echo "+changes")

listening() {
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# probe STOPFILE: the machine's own scheduling delay while a run goes on. A thread sleeps 1 ms in a
# loop and records how late it wakes, until STOPFILE appears; then prints the p99 and the longest
# delay in ms ("- -" without python3). A run's tail can be told from the machine's this way: this
# VM's hypervisor alone delays a wake-up by up to several ms now and then (docs/performance.md,
# "Where the tail comes from").
probe() {
    if ! command -v python3 >/dev/null; then
        echo "- -"
        return
    fi
    python3 - "$1" <<'PY'
import os, sys, time
late = []
# Also stop if the run's directory is gone (the script ended early).
while not os.path.exists(sys.argv[1]) and os.path.isdir(os.path.dirname(sys.argv[1])):
    t = time.perf_counter()
    time.sleep(0.001)
    late.append(time.perf_counter() - t - 0.001)
late.sort()
n = len(late)
print("%.2f %.2f" % (late[int(0.99 * (n - 1))] * 1e3, late[-1] * 1e3) if n else "- -")
PY
}

# broker_sched PID: the broker thread's nanoseconds on a core and runnable waiting for one ("- -"
# when it cannot be read). The thread may start just after the port opens, so it is looked for
# for up to a second.
broker_sched() {
    local t
    for _ in $(seq 1 20); do
        for t in /proc/"$1"/task/*; do
            if [ "$(cat "$t/comm" 2>/dev/null)" = cloakd-broker ]; then
                cut -d' ' -f1,2 "$t/schedstat" && return
            fi
        done
        sleep 0.05
    done
    echo "- -"
}

# in_daemon DIR: "in-daemon mean overhead (ms), broker run and wait per request (µs)" from the
# daemon's /metrics and the two schedstat snapshots; "-" for what could not be read.
in_daemon() {
    local metrics
    metrics=$( (exec 3<>"/dev/tcp/127.0.0.1/$metrics_port" &&
        printf 'GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n' >&3 && cat <&3) 2>/dev/null || true)
    echo "$metrics" | awk -v before="$(cat "$1/sched.before")" -v after="$(cat "$1/sched.after")" '
        /^cloakd_location_broker_overhead_seconds_sum/ { sum = $2 }
        /^cloakd_location_broker_overhead_seconds_count/ { n = $2 }
        END {
            split(before, b, " "); split(after, a, " ")
            if (n > 0) printf "%.2f ", 1000 * sum / n; else printf "- "
            if (n > 0 && b[1] != "-" && a[1] != "-")
                printf "%.1f %.1f\n", (a[1] - b[1]) / n / 1000, (a[2] - b[2]) / n / 1000
            else
                printf "- -\n"
        }'
}

# run BINARY [simulate options]: one daemon, one replay; writes "success p50 p99 cpu_us sim_cpu_us
# probe_p99_ms probe_max_ms in_daemon_ms broker_run_us broker_wait_us" to $work/result.
run() {
    local bin=$1 dir
    shift
    dir=$(mktemp -d -p "$work")
    printf '[telemetry]\nmetrics_listen = "127.0.0.1:%s"\n' "$metrics_port" >"$dir/bench.toml"
    (cd "$dir" && exec "$bin" serve --listen "127.0.0.1:$port" --config bench.toml >serve.log 2>&1) &
    daemon=$!
    for _ in $(seq 1 300); do
        if listening "$port" || ! kill -0 "$daemon" 2>/dev/null; then break; fi
        sleep 0.1
    done
    if ! listening "$port"; then
        echo "the daemon $bin did not listen on port $port (it ended, or 30 s passed); its log:" >&2
        cat "$dir/serve.log" >&2
        exit 1
    fi
    probe "$dir/stop" >"$dir/probe.out" &
    prober=$!
    broker_sched "$daemon" >"$dir/sched.before"
    if ! "$current" simulate --addr "http://127.0.0.1:$port" --pid "$daemon" "$@" >"$dir/simulate.out" 2>&1; then
        echo "the simulator failed against $bin; its output:" >&2
        cat "$dir/simulate.out" >&2
        exit 1
    fi
    broker_sched "$daemon" >"$dir/sched.after"
    touch "$dir/stop"
    wait "$prober" || true
    prober=
    in_daemon "$dir" >"$dir/in_daemon.out"
    kill "$daemon" 2>/dev/null || true
    wait "$daemon" 2>/dev/null || true
    daemon=
    awk '
        /^success rate/ { s = $3 }
        /^broker overhead/ { gsub(",", ""); p50 = $4; p99 = $10 }
        /^CPU of --pid/ { c = $6 }
        /^CPU of simulate/ { sim = $6 }
        END { printf "%s %s %s %s %s ", s, p50, p99, c, sim }
    ' "$dir/simulate.out" >"$work/result"
    tr '\n' ' ' <"$dir/probe.out" >>"$work/result"
    cat "$dir/in_daemon.out" >>"$work/result"
}

printf '%-6s %-16s %-10s %-12s %-12s %-14s %-14s %-18s %-16s %-22s %s\n' round build success "p50 (ms)" "p99 (ms)" "CPU/req (µs)" "sim CPU (µs)" "probe p99/max (ms)" "in daemon (ms)" "broker run/wait (µs)" load
for r in $(seq 1 "$rounds"); do
    if [ $((r % 2)) -eq 1 ]; then order="base current"; else order="current base"; fi
    for which in $order; do
        if [ "$which" = base ]; then bin=$base; name=$base_sha; else bin=$current; name=$current_sha; fi
        run "$bin" "$@"
        read -r success p50 p99 cpu sim probe_p99 probe_max in_daemon broker_run broker_wait <"$work/result"
        load=$(cut -d' ' -f1 /proc/loadavg)
        printf '%-6s %-16s %-10s %-12s %-12s %-14s %-14s %-18s %-16s %-22s %s\n' "$r" "$name" "$success%" "$p50" "$p99" "$cpu" "${sim:--}" "$probe_p99/$probe_max" "${in_daemon:--}" "${broker_run:--}/${broker_wait:--}" "$load"
        echo "$name $p50 $p99 $cpu" >>"$work/rows"
    done
done

# Per build: the best and the median of the rounds (issue 44's targets are the best of three quiet runs).
echo
printf '%-16s %-22s %-22s %s\n' build "p50 best/median (ms)" "p99 best/median (ms)" "CPU/req median (µs)"
for name in "$base_sha" "$current_sha"; do
    awk -v name="$name" '
        function median(v, n,   i, j, t) {
            for (i = 2; i <= n; i++) for (j = i; j > 1 && v[j - 1] > v[j]; j--) { t = v[j]; v[j] = v[j - 1]; v[j - 1] = t }
            return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
        }
        $1 == name && $2 != "" { n++; p50[n] = $2; p99[n] = $3; cpu[n] = $4 }
        END {
            if (n == 0) exit
            m50 = median(p50, n); m99 = median(p99, n); mc = median(cpu, n)
            printf "%-16s %-22s %-22s %.1f\n", name, sprintf("%.2f/%.2f", p50[1], m50), sprintf("%.2f/%.2f", p99[1], m99), mc
        }' "$work/rows"
done
