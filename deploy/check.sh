#!/usr/bin/env bash
# Offline checks of deploy/: every kustomize overlay renders and its objects validate against the
# Kubernetes schemas (kubernetes-validate, pinned version, strict), the Prometheus rules pass
# `promtool check rules` and their unit tests, and the Grafana dashboard is valid JSON.
# Needs kubectl, kubernetes-validate (PyPI) and promtool (Debian's `prometheus` package).
set -euo pipefail
cd "$(dirname "$0")"

# The Kubernetes version the manifests target (native gRPC probes need >= 1.24).
K8S_VERSION="${K8S_VERSION:-1.32.0}"

rendered="$(mktemp -d)"
trap 'rm -rf "$rendered"' EXIT

for overlay in k8s/overlays/*/; do
    name="$(basename "$overlay")"
    echo "== kubectl kustomize $overlay"
    kubectl kustomize "$overlay" > "$rendered/$name.yaml"
    echo "== kubernetes-validate --strict -k $K8S_VERSION ($name)"
    kubernetes-validate --quiet --strict -k "$K8S_VERSION" "$rendered/$name.yaml"
    # The properties the runbook relies on, checked on the rendered objects.
    for required in "runAsNonRoot: true" "readOnlyRootFilesystem: true" "grpc:" \
        "kind: PodDisruptionBudget" "kind: PersistentVolumeClaim\|volumeClaimTemplates:"; do
        grep -q -e "$required" "$rendered/$name.yaml" || {
            echo "$name: rendered manifests lack '$required'" >&2
            exit 1
        }
    done
done

echo "== promtool check rules"
promtool check rules prometheus/alerts.yml
echo "== promtool test rules"
promtool test rules prometheus/alerts.test.yml

echo "== grafana dashboard parses"
python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); assert d["panels"], "no panels"' grafana/cloakd.json
echo "deploy/: all checks passed"
