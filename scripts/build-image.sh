#!/usr/bin/env bash
# Builds Herder's container image (deploy/Dockerfile) from the release binary, without pulling
# any base image: the root filesystem is assembled here from the binary and the shared libraries
# it links, as this machine has them.
#   ./scripts/build-image.sh              # image herder:local
#   IMAGE=registry.example/herder:1.0 ./scripts/build-image.sh
set -euo pipefail
source "$(dirname "$0")/lib.sh"
IMAGE="${IMAGE:-herder:local}"
ensure_built

context=$(mktemp -d "${TMPDIR:-/tmp}/herder-image.XXXXXX")
trap 'rm -rf "$context"' EXIT
root="$context/rootfs"
mkdir -p "$root/usr/local/bin" "$root/etc/ssl/certs" "$root/tmp" "$context/data"
install -m 0755 "$HERDER_BIN" "$root/usr/local/bin/herder"
# Every shared library the binary loads, and the dynamic loader, at the paths it looks for them.
for library in $(ldd "$HERDER_BIN" | grep -o '/[^ ]*'); do
    mkdir -p "$root$(dirname "$library")"
    cp -L "$library" "$root$library"
done
# Host names resolve from /etc/hosts and DNS (both provided by the container runtime).
echo "hosts: files dns" >"$root/etc/nsswitch.conf"
echo "herder:x:10001:10001:herder:/var/lib/herder:/nonexistent" >"$root/etc/passwd"
echo "herder:x:10001:" >"$root/etc/group"
if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
    cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/"
fi
chmod 1777 "$root/tmp"
touch "$context/data/.keep"
cp "$HERDER_ROOT/deploy/Dockerfile" "$context/Dockerfile"
docker build --quiet -t "$IMAGE" "$context" >/dev/null
size=$(docker image inspect "$IMAGE" --format '{{.Size}}')
echo "==> Built $IMAGE ($((size / 1024 / 1024)) MiB)" >&2
