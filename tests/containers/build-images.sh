#!/bin/sh
# The container tier's images, built from this machine's own files with no registry:
# a rootfs of Debian's busybox-static, tarred and `podman import`ed. Quick when the
# image exists already (the tag names the recipe's version: bump it to rebuild).
#   localhost/pai-test-busybox:1  sh and coreutils from busybox, /etc/pai-image
#                                 holding "pai-test-busybox" (a file only the image has)
set -eu
IMAGE=localhost/pai-test-busybox:1
HERE=$(cd "$(dirname "$0")" && pwd)
: "${CONTAINERS_CONF:=$HERE/../../deploy/containers/containers.conf}"
: "${CONTAINERS_STORAGE_CONF:=$HERE/../../deploy/containers/storage.conf}"
export CONTAINERS_CONF CONTAINERS_STORAGE_CONF
if podman image exists "$IMAGE" 2>/dev/null; then exit 0; fi
BUSYBOX=$(command -v busybox || echo /bin/busybox)
ROOT=$(mktemp -d)
trap 'rm -rf "$ROOT"' EXIT
mkdir -p "$ROOT/bin" "$ROOT/etc" "$ROOT/tmp" "$ROOT/proc" "$ROOT/sys" "$ROOT/dev" "$ROOT/root"
chmod 1777 "$ROOT/tmp"
cp "$BUSYBOX" "$ROOT/bin/busybox"
for applet in $("$ROOT/bin/busybox" --list); do
    [ -e "$ROOT/bin/$applet" ] || ln -s busybox "$ROOT/bin/$applet"
done
echo "root:x:0:0:root:/root:/bin/sh" > "$ROOT/etc/passwd"
echo "root:x:0:" > "$ROOT/etc/group"
echo "pai-test-busybox" > "$ROOT/etc/pai-image"
tar -C "$ROOT" -c . | podman import -q --change 'ENV PATH=/bin' --change 'CMD ["/bin/sh"]' - "$IMAGE" >/dev/null
echo "built $IMAGE"
