#!/bin/sh
# Install the Debian 12 packages moonshine builds and tests with, only those missing.
set -eu
PKGS="gcc make libc6-dev liburing-dev libcjson-dev libpcre2-dev clang libclang-rt-14-dev llvm python3 python3-jinja2 libssl-dev unicode-data bzip2 python3-regex python3-crcmod libmicrohttpd-dev libedit-dev xxd curl"
# the server tests run the OpenAI Node SDK: Debian's nodejs/npm unless a node is already installed
command -v node >/dev/null 2>&1 || PKGS="$PKGS nodejs npm"
# the web chat page test (tests/server/web.mjs) drives a headless Chromium through puppeteer-core
command -v chromium >/dev/null 2>&1 || PKGS="$PKGS chromium"
# make check compiles the GPU backend with every GPU compiler it finds (nothing runs). Debian
# has hipcc (ROCm 5.2), optional: without it that stage is skipped. CUDA's nvcc is not in
# Debian; the CUDA half runs where NVIDIA's toolkit is installed (/usr/local/cuda*).
GPU_PKGS="hipcc libamdhip64-dev"
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
missing=""
for p in $PKGS; do
    installed "$p" || missing="$missing $p"
done
gpu_missing=""
if ! command -v hipcc >/dev/null 2>&1 && [ ! -x /opt/rocm/bin/hipcc ]; then
    for p in $GPU_PKGS; do
        installed "$p" || gpu_missing="$gpu_missing $p"
    done
fi
sdk_deps() { # the pinned OpenAI and Anthropic SDKs, puppeteer-core (tests/server/sdk/package-lock.json)
    d=$(dirname "$0")/../tests/server/sdk
    [ -f "$d/node_modules/openai/package.json" ] && [ -f "$d/node_modules/@anthropic-ai/sdk/package.json" ] || (cd "$d" && npm ci --no-audit --no-fund --loglevel=error)
}
[ -z "$missing$gpu_missing" ] && { sdk_deps; exit 0; }
if [ "$(id -u)" != 0 ]; then
    [ -n "$gpu_missing" ] && echo "install-deps: optional packages missing:$gpu_missing (no hipcc: make check skips the HIP compile; sudo apt-get install$gpu_missing)" >&2
    if [ -n "$missing" ]; then
        echo "install-deps: missing packages:$missing (run as root, or: sudo apt-get install$missing)" >&2
        exit 1
    fi
    sdk_deps
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
if [ -n "$missing" ]; then
    echo "install-deps: installing$missing"
    apt-get install -y -qq --no-install-recommends $missing
fi
if [ -n "$gpu_missing" ]; then
    if apt-cache policy hipcc 2>/dev/null | grep -q 'Candidate: [0-9]'; then
        echo "install-deps: installing$gpu_missing (make check's HIP compile)"
        apt-get install -y -qq --no-install-recommends $gpu_missing ||
            echo "install-deps: could not install$gpu_missing: make check skips the HIP compile" >&2
    else
        echo "install-deps: apt has no hipcc here: make check skips the HIP compile" >&2
    fi
fi
sdk_deps
