#!/usr/bin/env bash
# Builds deploy/container/Containerfile without pulling anything, then runs the image and checks it.
#
# The public base images (rust:*-bookworm, debian:bookworm-slim) are replaced by base images made
# from this machine's own Debian bookworm packages (host-rootfs.py lists their files; `podman import`
# turns the tarball into an image):
#   localhost/cloakd-local/debian:bookworm-slim  Debian's required packages and what they depend on
#                                                (what debootstrap minbase and the slim image hold)
#   localhost/cloakd-local/rust:bookworm         the same plus gcc, libc6-dev and ca-certificates;
#                                                this machine's Rust toolchain and cargo home are
#                                                bind-mounted into the build's RUN steps at the same
#                                                paths (RUSTUP_HOME, CARGO_HOME, PATH set to them), and
#                                                the target directory as a cache, so dependencies
#                                                built here already are reused
# The Containerfile itself is used unchanged (only its BUILDER_IMAGE/RUNTIME_IMAGE arguments are set).
# The image is then started with host networking on loopback ports and checked: it runs as uid 10001,
# serves /metrics, took its data directory on the volume, and has the declared user, volume, ports
# and command.
#
# Exit status: 0 built and checked; 77 skipped (podman missing or unable to run containers here, or
# not a Debian bookworm host, so no faithful local base can be made); anything else is a failure.
#
#   deploy/container/build-local.sh            # image tag cloakd:local
set -euo pipefail
cd "$(dirname "$0")/../.."

skip() {
    echo "SKIP: $*" >&2
    exit 77
}

command -v podman >/dev/null || skip "podman is not installed"
command -v python3 >/dev/null || skip "python3 is not installed"
# shellcheck disable=SC1091
. /etc/os-release
[ "${ID:-}" = debian ] && [ "${VERSION_CODENAME:-}" = bookworm ] \
    || skip "not a Debian bookworm host (${PRETTY_NAME:-unknown}): no local stand-in for the bookworm base images"
command -v rustup >/dev/null && command -v cargo >/dev/null || skip "no Rust toolchain to mount into the builder"
podman info >/dev/null 2>&1 || skip "podman does not work here: $(podman info 2>&1 | tail -1)"
for package in gcc libc6-dev ca-certificates; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" \
        || skip "the builder base needs the host package $package"
done

RUSTUP_HOME="${RUSTUP_HOME:-$HOME/.rustup}"
CARGO_HOME="${CARGO_HOME:-$HOME/.cargo}"
TAG="${TAG:-cloakd:local}"
# Cargo's target directory for the builder stage, mounted as a cache (the image gets only the binary).
TARGET_CACHE="${TARGET_CACHE:-${CARGO_TARGET_DIR:-$PWD/target}}"
mkdir -p "$TARGET_CACHE"
RUNTIME_BASE=localhost/cloakd-local/debian:bookworm-slim
BUILDER_BASE=localhost/cloakd-local/rust:bookworm
NAME="cloakd-local-check-$$"

work="$(mktemp -d)"
cleanup() {
    podman rm -f "$NAME" >/dev/null 2>&1 || true
    podman volume rm -f "$NAME" >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT

base_image() { # base_image TAG [EXTRA_PACKAGE ...] [-- podman import --change ...]
    local tag="$1"
    shift
    local packages=() changes=()
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do packages+=("$1"); shift; done
    [ $# -gt 0 ] && shift && changes=("$@")
    echo "== base image $tag from this machine's packages ${packages[*]:-(minbase)}"
    # (Without the paths written below, which a layer may hold only once.)
    python3 deploy/container/host-rootfs.py "${packages[@]}" \
        | grep -vxE 'etc/(passwd|group|shadow|gshadow)|tmp|var/tmp' > "$work/files"
    tar --no-recursion -C / -T "$work/files" -cf "$work/rootfs.tar"
    # What postinst scripts would create: the system users and groups of base-passwd, and /tmp.
    mkdir -p "$work/extra/etc" "$work/extra/tmp" "$work/extra/var/tmp"
    chmod 1777 "$work/extra/tmp" "$work/extra/var/tmp"
    cp /usr/share/base-passwd/passwd.master "$work/extra/etc/passwd"
    cp /usr/share/base-passwd/group.master "$work/extra/etc/group"
    cut -d: -f1 "$work/extra/etc/passwd" | sed 's/$/:*:19000:0:99999:7:::/' > "$work/extra/etc/shadow"
    cut -d: -f1 "$work/extra/etc/group" | sed 's/$/:*::/' > "$work/extra/etc/gshadow"
    chmod 0640 "$work/extra/etc/shadow" "$work/extra/etc/gshadow"
    tar -C "$work/extra" -rf "$work/rootfs.tar" etc/passwd etc/group etc/shadow etc/gshadow tmp var/tmp
    podman import "${changes[@]}" "$work/rootfs.tar" "$tag" >/dev/null
    rm -rf "$work/rootfs.tar" "$work/extra"
}

base_image "$RUNTIME_BASE" -- --change 'CMD ["/bin/bash"]'

# Containers get this process's own limits (podman's defaults may exceed what an unprivileged
# sandbox may set), and the first OCI runtime that can start a container here.
limits=(--ulimit "nofile=$(ulimit -Hn):$(ulimit -Hn)" --ulimit "nproc=4096:4096")
runtime=()
found=no
for candidate in default runc; do
    flags=()
    if [ "$candidate" != default ]; then
        command -v "$candidate" >/dev/null || continue
        flags=(--runtime "$candidate")
    fi
    if podman "${flags[@]}" run --rm --network none "${limits[@]}" "$RUNTIME_BASE" true >"$work/probe" 2>&1; then
        runtime=("${flags[@]}")
        found=yes
        break
    fi
    echo "podman ($candidate runtime) cannot start a container: $(tail -1 "$work/probe")" >&2
done
[ "$found" = yes ] || skip "no OCI runtime can start a container here (see above)"
base_image "$BUILDER_BASE" gcc libc6-dev ca-certificates -- \
    --change "ENV RUSTUP_HOME=$RUSTUP_HOME" \
    --change "ENV CARGO_HOME=$CARGO_HOME" \
    --change "ENV PATH=$CARGO_HOME/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
    --change 'CMD ["/bin/bash"]'

echo "== podman build (deploy/container/Containerfile, unchanged)"
# The toolchain read-only; the cargo home writable for its registry cache and locks; the target
# directory as a build cache.
podman "${runtime[@]}" build "${limits[@]}" \
    --build-arg "BUILDER_IMAGE=$BUILDER_BASE" \
    --build-arg "RUNTIME_IMAGE=$RUNTIME_BASE" \
    --volume "$RUSTUP_HOME:$RUSTUP_HOME:ro" \
    --volume "$CARGO_HOME:$CARGO_HOME" \
    --volume "$TARGET_CACHE:/src/target" \
    -f deploy/container/Containerfile -t "$TAG" .

echo "== image metadata"
user="$(podman image inspect -f '{{.Config.User}}' "$TAG")"
volumes="$(podman image inspect -f '{{range $k, $v := .Config.Volumes}}{{$k}} {{end}}' "$TAG")"
ports="$(podman image inspect -f '{{range $k, $v := .Config.ExposedPorts}}{{$k}} {{end}}' "$TAG")"
command="$(podman image inspect -f '{{join .Config.Entrypoint " "}} {{join .Config.Cmd " "}}' "$TAG")"
[ "$user" = "10001:10001" ] || { echo "user is '$user'" >&2; exit 1; }
[[ "$volumes" == *"/var/lib/cloakd"* ]] || { echo "volumes: '$volumes'" >&2; exit 1; }
[[ "$ports" == *"50051/tcp"* && "$ports" == *"9464/tcp"* ]] || { echo "ports: '$ports'" >&2; exit 1; }
[ "$command" = "/usr/local/bin/cloakd serve --config /etc/cloakd/config.toml" ] \
    || { echo "command: '$command'" >&2; exit 1; }

echo "== run the image (host network, loopback ports) and check it"
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
grpc_port="$(free_port)"
metrics_port="$(free_port)"
podman volume create "$NAME" >/dev/null
# The image's config listens on every interface of its own network namespace; sharing the host's,
# loopback addresses keep it private to this machine.
podman "${runtime[@]}" run -d "${limits[@]}" --name "$NAME" --network host --read-only --tmpfs /tmp \
    -v "$NAME:/var/lib/cloakd" \
    -e "CLOAKD_SERVER__LISTEN=127.0.0.1:$grpc_port" \
    -e "CLOAKD_TELEMETRY__METRICS_LISTEN=127.0.0.1:$metrics_port" \
    "$TAG" >/dev/null
for _ in $(seq 1 100); do
    if python3 - "$metrics_port" <<'EOF' 2>/dev/null; then break; fi
import sys, urllib.request
body = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=2).read().decode()
assert "cloakd_build_info" in body
EOF
    sleep 0.2
done
python3 - "$metrics_port" <<'EOF' || { podman logs "$NAME" >&2; exit 1; }
import sys, urllib.request
body = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=2).read().decode()
assert "cloakd_build_info" in body, body[:500]
EOF
uid="$(podman exec "$NAME" id -u)"
[ "$uid" = 10001 ] || { echo "runs as uid $uid" >&2; exit 1; }
podman exec "$NAME" sh -c 'test -n "$(ls -A /var/lib/cloakd)"' \
    || { echo "nothing in the data volume" >&2; exit 1; }
podman logs "$NAME" 2>&1 | grep -q "cloakd listening" || { podman logs "$NAME" >&2; exit 1; }
podman stop -t 10 "$NAME" >/dev/null
status="$(podman inspect -f '{{.State.ExitCode}}' "$NAME")"
[ "$status" = 0 ] || { echo "exit status $status after SIGTERM" >&2; podman logs "$NAME" >&2; exit 1; }
echo "container image $TAG: built from the Containerfile and checked"
