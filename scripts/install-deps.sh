#!/usr/bin/env bash
# Installs every build and test dependency of nf from Debian 12 packages.
# Idempotent: packages already present are left alone. The CUDA 13 toolkit is
# expected at /usr/local/cuda (it is not a Debian package).
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache git python3
  llvm-22-dev llvm-22-tools libmlir-22-dev mlir-22-tools
  libflatbuffers-dev flatbuffers-compiler
  libcli11-dev nlohmann-json3-dev libgtest-dev libgmock-dev libcpp-httplib-dev
  python3-jinja2
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  SUDO="sudo"
fi
echo "install-deps: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
