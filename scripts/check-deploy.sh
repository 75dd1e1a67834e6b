#!/usr/bin/env bash
# Checks the deployment descriptions offline: the Kubernetes manifests against the schemas of
# Kubernetes 1.37 (strict: an unknown field is an error), with kubernetes-validate from PyPI
# (installed if missing); and the compose file through docker-compose's own parser, where
# docker-compose is installed.
#   ./scripts/check-deploy.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
if ! command -v kubernetes-validate >/dev/null; then
    python3 -m pip install --quiet kubernetes-validate
fi
kubernetes-validate --strict --kubernetes-version 1.37.0 --quiet \
    "$root"/deploy/kubernetes/*.yaml
echo "==> deploy/kubernetes: valid against Kubernetes 1.37 (strict)"
if command -v docker-compose >/dev/null; then
    secrets=$(mktemp -d)
    trap 'rm -rf "$secrets"' EXIT
    HERDER_SECRETS="$secrets" docker-compose -f "$root/deploy/compose.yaml" config --quiet
    echo "==> deploy/compose.yaml: valid"
fi
