#!/usr/bin/env bash
# Installs Debian's headless-capable Chromium for the dashboard browser tests (idempotent).
set -euo pipefail

if command -v chromium >/dev/null 2>&1; then
    echo "chromium already installed: $(chromium --version 2>/dev/null || echo unknown version)"
    exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        SUDO="sudo"
    else
        echo "install-browser.sh: need root (or sudo) to apt-get install chromium" >&2
        exit 1
    fi
fi

# Refresh package lists only when apt knows no candidate for chromium yet.
candidate="$(apt-cache policy chromium 2>/dev/null | awk '/Candidate:/ {print $2}')"
if [ -z "${candidate}" ] || [ "${candidate}" = "(none)" ]; then
    $SUDO apt-get update
fi

$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium
echo "installed: $(chromium --version 2>/dev/null || echo chromium)"
