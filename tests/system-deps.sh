#!/bin/sh
# The Debian packages the test tiers drive for real, installed in one apt-get run
# (`make test` runs this; one `apt-get update` and one dpkg transaction for all tiers
# rather than one each saves a fresh machine a minute). Quick when they are there.
# Without root or apt-get nothing is installed: each tier whose program is missing
# says so and skips.
#   ./tests/system-deps.sh [TIER ...]   (default: every tier)
# Tiers and what they need:
#   browser    chromium                         (tests/browser, Playwright drives it)
#   postgres   postgresql, without the package's own cluster (tests start their own)
#   containers podman runc conmon netavark busybox-static (rootful podman; images built
#              from this machine's files by tests/containers/build-images.sh)
#   ssh        openssh-client openssh-server libnss-wrapper (tasks start their own sshd)
#   alerting   prometheus (promtool) prometheus-alertmanager (tests start their own)
set -eu
TIERS=${*:-browser postgres containers ssh alerting}

have() { command -v "$1" >/dev/null 2>&1; }

missing_of() {
    case $1 in
    browser) [ -x /usr/bin/chromium ] || echo chromium ;;
    postgres) have initdb || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || echo postgresql ;;
    containers) { have podman && have runc && have busybox; } || echo podman runc conmon netavark busybox-static ;;
    ssh) { have ssh && [ -x /usr/sbin/sshd ] && ls /usr/lib/*/libnss_wrapper.so >/dev/null 2>&1; } ||
        echo openssh-client openssh-server libnss-wrapper ;;
    alerting) { have promtool && have prometheus-alertmanager; } || echo prometheus prometheus-alertmanager ;;
    *) echo "tests/system-deps.sh: no tier '$1'" >&2; exit 2 ;;
    esac
}

PACKAGES=""
for tier in $TIERS; do
    PACKAGES="$PACKAGES $(missing_of "$tier")"
done
PACKAGES=$(echo $PACKAGES)  # (unquoted: one space between names)

if [ -n "$PACKAGES" ]; then
    SUDO=""
    if [ "$(id -u)" != 0 ]; then
        if have sudo && sudo -n true 2>/dev/null; then SUDO="sudo -n"; else SUDO=none; fi
    fi
    if [ "$SUDO" = none ] || ! have apt-get; then
        echo "tests: missing $PACKAGES and this user may not install them (not root on Debian, no sudo):" \
             "the tiers that drive them will skip (apt-get install $PACKAGES)" >&2
        exit 0
    fi
    case " $PACKAGES " in
    *" postgresql "*)  # the package would otherwise create and start a cluster of its own
        $SUDO mkdir -p /etc/postgresql-common
        grep -qs '^create_main_cluster' /etc/postgresql-common/createcluster.conf ||
            echo 'create_main_cluster = false' | $SUDO tee -a /etc/postgresql-common/createcluster.conf >/dev/null ;;
    esac
    echo "tests: installing $PACKAGES (apt)"
    $SUDO apt-get update -qq
    OPTIONS="-y -qq -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold"
    # Chromium with what it recommends (its fonts among them: pages and screenshots
    # drawn as a user's browser draws them); the others without.
    REST=$(echo " $PACKAGES " | sed 's/ chromium / /')
    [ "$REST" = " $PACKAGES " ] || DEBIAN_FRONTEND=noninteractive $SUDO apt-get install $OPTIONS chromium >/dev/null
    REST=$(echo $REST)
    [ -z "$REST" ] || DEBIAN_FRONTEND=noninteractive $SUDO apt-get install $OPTIONS --no-install-recommends $REST >/dev/null
fi

case " $TIERS " in
*" containers "*)
    if have podman && [ "$(id -u)" = 0 ]; then sh "$(dirname "$0")/containers/build-images.sh"; fi ;;
esac
