#!/bin/sh
# Install the Debian 12 packages moonshine builds and tests with, only those missing.
set -eu
PKGS="gcc make libc6-dev liburing-dev libcjson-dev libpcre2-dev clang libclang-rt-14-dev llvm python3 python3-jinja2 libssl-dev unicode-data bzip2 python3-regex python3-crcmod libmicrohttpd-dev libedit-dev"
# the server tests run the OpenAI Node SDK: Debian's nodejs/npm unless a node is already installed
command -v node >/dev/null 2>&1 || PKGS="$PKGS nodejs npm"
missing=""
for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
sdk_deps() { # the pinned OpenAI SDK (tests/server/sdk/package-lock.json)
    d=$(dirname "$0")/../tests/server/sdk
    [ -f "$d/node_modules/openai/package.json" ] || (cd "$d" && npm ci --no-audit --no-fund --loglevel=error)
}
[ -z "$missing" ] && { sdk_deps; exit 0; }
if [ "$(id -u)" != 0 ]; then
    echo "install-deps: missing packages:$missing (run as root, or: sudo apt-get install$missing)" >&2
    exit 1
fi
echo "install-deps: installing$missing"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends $missing
sdk_deps
