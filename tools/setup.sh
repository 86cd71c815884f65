#!/usr/bin/env bash
# Installs what deepinfer needs to build and test on Debian 12, by package name.
# Safe to run repeatedly: only missing packages are installed.
set -euo pipefail
pkgs=(build-essential cmake pkg-config nlohmann-json3-dev libpcre2-dev libcli11-dev
      libgtest-dev libgmock-dev libbenchmark-dev clang libclang-rt-14-dev python3 python3-pip
      python3-jsonschema libboost1.81-dev prometheus-cpp-dev
      libopenmpi-dev openmpi-bin)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}" >&2
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# The property test validates with `jsonschema` under whichever python3 comes first on PATH
# (CMake's FindPython3 picks that one, e.g. a pyenv interpreter rather than /usr/bin/python3).
if ! python3 -c "import jsonschema" 2>/dev/null; then
  echo "setup: pip install jsonschema for $(command -v python3)" >&2
  python3 -m pip install --quiet jsonschema 2>/dev/null ||
    python3 -m pip install --quiet --break-system-packages jsonschema
fi
# The server tests (tests/server) talk to `deepinfer serve` with the official clients; the
# bench sweep test plots with matplotlib (bench/plot_pareto.py).
for mod in openai httpx pytest schemathesis matplotlib; do
  if ! python3 -c "import $mod" 2>/dev/null; then
    echo "setup: pip install $mod for $(command -v python3)" >&2
    python3 -m pip install --quiet "$mod" 2>/dev/null ||
      python3 -m pip install --quiet --break-system-packages "$mod"
  fi
done
# The CUDA backend's Hopper grouped GEMMs (backend/cuda/moe_cutlass.cu) use CUTLASS/CuTe headers
# from the `nvidia-cutlass` wheel (cutlass_library/source/include; CMake asks python3 where it
# is, or takes -DDEEPINFER_CUTLASS_DIR). Only where nvcc is present (a CUDA build); the headers
# are all it needs, so without its Python dependencies.
if command -v nvcc >/dev/null 2>&1 || [[ -x /usr/local/cuda/bin/nvcc ]]; then
  if ! python3 -c "import cutlass_library" 2>/dev/null; then
    echo "setup: pip install nvidia-cutlass (headers) for $(command -v python3)" >&2
    python3 -m pip install --quiet --no-deps nvidia-cutlass 2>/dev/null ||
      python3 -m pip install --quiet --no-deps --break-system-packages nvidia-cutlass
  fi
fi
