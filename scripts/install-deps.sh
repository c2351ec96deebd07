#!/usr/bin/env bash
# Installs every build and test dependency of nf from Debian 12 packages.
# Idempotent: packages already present are left alone. The CUDA 13 toolkit is
# expected at /usr/local/cuda (it is not a Debian package). clang, its
# sanitizer/libFuzzer runtimes and its OpenMP build the fuzz targets
# (scripts/fuzz.sh).
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache git python3
  llvm-22-dev llvm-22-tools libmlir-22-dev mlir-22-tools
  libflatbuffers-dev flatbuffers-compiler
  libcli11-dev nlohmann-json3-dev libgtest-dev libgmock-dev libcpp-httplib-dev
  libdlpack-dev
  prometheus-cpp-dev
  python3-jinja2 python3-pip
  clang libclang-rt-14-dev libomp-14-dev
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  SUDO="sudo"
fi
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all packages present"
else
  echo "install-deps: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Test tooling from PyPI: the official OpenAI client, Prometheus's text
# parser and lm-evaluation-harness (the serve tests use them and fail
# without them), for the Python that lit runs the tests with (Debian's,
# /usr/bin/python3).
python_modules=(openai prometheus_client lm_eval)
python_packages=(openai prometheus_client "lm_eval[api]==0.4.13")
py=/usr/bin/python3
[ -x "$py" ] || py=python3
if ! "$py" -c "import $(IFS=,; echo "${python_modules[*]}")" 2>/dev/null; then
  echo "install-deps: pip installing ${python_packages[*]} for $py"
  $SUDO "$py" -m pip install -q "${python_packages[@]}" 2>/dev/null ||
    $SUDO "$py" -m pip install -q --break-system-packages "${python_packages[@]}"
fi
