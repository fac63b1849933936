#!/usr/bin/env bash
# Records acknowledged per second through cloakd replicas on NATS JetStream, with the CPU seconds per
# record of every process (docs/performance.md).
#
#   benches/publish_replicas.sh REPLICAS NATS_NODES [cloakd publish-load options]
#
# REPLICAS cloakd replicas (release binary: target/release/cloakd, or $CLOAKD) on NATS_NODES
# nats-server processes ($NATS_SERVER, else nats-server on PATH) with JetStream; the replication
# factor is NATS_NODES (1 or 3). NATS_NODES = 0 runs one standalone daemon on its embedded file store
# instead. Everything listens on loopback ports from $PORT_BASE (default 24000) and is stopped at the
# end; the stores live in a temporary directory that is removed.
#
#   cargo build --release
#   benches/publish_replicas.sh 1 0 --records 200000      # standalone, file store
#   benches/publish_replicas.sh 2 3 --records 200000      # 2 replicas, 3-node NATS, replication 3
#   LOAD=simulate benches/publish_replicas.sh 2 1 --trace T --limit 300000 --clients 32 --rate 20000
set -euo pipefail

replicas=${1:?usage: publish_replicas.sh REPLICAS NATS_NODES [publish-load options]}
nodes=${2:?usage: publish_replicas.sh REPLICAS NATS_NODES [publish-load options]}
shift 2
cloakd=${CLOAKD:-target/release/cloakd}
nats=${NATS_SERVER:-nats-server}
base=${PORT_BASE:-24000}
work=$(mktemp -d)
pids=()

cleanup() {
    for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

# GET http://127.0.0.1:$1$2 answers 200.
http_ok() {
    (
        exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
        printf 'GET %s HTTP/1.0\r\n\r\n' "$2" >&3
        head -1 <&3 | grep -q ' 200 '
    ) 2>/dev/null
}

# Something listens on 127.0.0.1:$1.
listening() {
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

wait_for() {
    local what=$1
    shift
    for _ in $(seq 1 300); do
        if "$@"; then return 0; fi
        sleep 0.1
    done
    echo "$what did not come up" >&2
    exit 1
}

if [ "$nodes" -gt 0 ]; then
    routes=""
    for i in $(seq 0 $((nodes - 1))); do
        routes="$routes${routes:+,}nats://127.0.0.1:$((base + 100 + i))"
    done
    seeds=""
    for i in $(seq 0 $((nodes - 1))); do
        args=(-js -sd "$work/nats$i" -a 127.0.0.1 -p $((base + i)) -m $((base + 50 + i)) -n "n$i")
        if [ "$nodes" -gt 1 ]; then
            args+=(--cluster_name bench --cluster "nats://127.0.0.1:$((base + 100 + i))" --routes "$routes")
        fi
        "$nats" "${args[@]}" >"$work/nats$i.log" 2>&1 &
        pids+=($!)
        seeds="$seeds${seeds:+,}nats://127.0.0.1:$((base + i))"
    done
    for i in $(seq 0 $((nodes - 1))); do
        wait_for "nats-server $i" http_ok $((base + 50 + i)) '/healthz?js-enabled-only=true'
    done
    # A JetStream cluster elects its meta leader after the servers are up.
    wait_for "the JetStream meta leader" http_ok $((base + 50)) '/healthz'
fi

addrs=""
for r in $(seq 0 $((replicas - 1))); do
    port=$((base + 200 + r))
    if [ "$nodes" -gt 0 ]; then
        export CLOAKD_CLUSTER__NATS_URL="\"$seeds\"" CLOAKD_CLUSTER__NODE_ID="\"r$r\"" \
            CLOAKD_CLUSTER__REPLICAS=$nodes
    fi
    CLOAKD_TELEMETRY__METRICS_LISTEN='""' CLOAKD_TRANSACTIONS__DATA_DIR="\"$work/data$r\"" \
        "$cloakd" --log-filter warn serve --listen "127.0.0.1:$port" >"$work/cloakd$r.log" 2>&1 &
    pids+=($!)
    wait_for "cloakd replica $r" listening "$port"
    addrs="$addrs${addrs:+,}http://127.0.0.1:$port"
done

echo "replicas $replicas, NATS nodes $nodes (replication $nodes); pids: cloakd ${pids[*]: -$replicas}, nats ${pids[*]:0:$nodes}" >&2
pid_list=$(IFS=,; echo "${pids[*]}")
# LOAD=simulate replays a mobility trace through the replicas instead (location requests).
"$cloakd" "${LOAD:-publish-load}" --addr "$addrs" --pid "$pid_list" "$@"
