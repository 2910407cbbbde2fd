#!/bin/sh
# Debian's chromium for the browser tests (tests/browser), run by `make test`.
# Quick when it is there already; Playwright drives it (no browser download).
set -eu
[ -x /usr/bin/chromium ] && exit 0
SUDO=""
if [ "$(id -u)" != 0 ]; then
  if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    SUDO="sudo -n"
  else
    echo "tests/browser: /usr/bin/chromium is missing and this user may not install it (not root, no sudo):" \
         "the browser tests will be skipped; install it with: apt-get install chromium" >&2
    exit 0
  fi
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "tests/browser: no apt-get here to install chromium: the browser tests will be skipped" >&2
  exit 0
fi
echo "tests/browser: installing chromium (apt) for the browser tests"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
