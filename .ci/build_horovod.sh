#!/usr/bin/env bash
# Build Horovod 0.28.1 (torch + gloo, no MPI/TF/MXNet, no [spark] extra) from the PyPI sdist
# against the torch already in the venv, cache the wheel, and install it without touching torch.
# 0.28.1 asks for C++14 but torch >= 2.1 headers need C++17, and CXXFLAGS lose to the -std=c++14
# its CMake adds, so the two CMakeLists lines are patched (see shared/design.md section 4).
# Usage: .ci/build_horovod.sh VENV_PYTHON   (run from the repository root; `make horovod`)
set -euo pipefail
PY=${1:?usage: build_horovod.sh path/to/venv/python}
VERSION=0.28.1
# Outside the checkout, so fresh clones on this machine (CI) reuse the build.
CACHE=${SPARKDIST_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sparkdist/wheels}
PIP=("$PY" -m pip --disable-pip-version-check)

wheel=$(ls "$CACHE"/horovod-$VERSION-*.whl 2>/dev/null | head -n1 || true)
if [ -z "$wheel" ]; then
  work=$(mktemp -d "${TMPDIR:-/tmp}/horovod-build.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  export PATH="$(dirname "$PY"):$PATH"
  if ! cmake --version >/dev/null 2>&1; then      # Horovod needs CMake >= 3.13
    "${PIP[@]}" install --quiet 'cmake>=3.13,<4'
  fi
  "${PIP[@]}" download --quiet --no-binary :all: --no-deps -d "$work" "horovod==$VERSION"
  tar -xzf "$work/horovod-$VERSION.tar.gz" -C "$work"
  src="$work/horovod-$VERSION"
  for f in "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"; do
    grep -q 'set(CMAKE_CXX_STANDARD 14)' "$f" || { echo "unexpected $f: no C++14 line" >&2; exit 1; }
    sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' "$f"
  done
  mkdir -p "$CACHE"
  echo "Building Horovod $VERSION against torch $("$PY" -c 'import torch; print(torch.__version__)') (several minutes)"
  HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
  HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS="-j$(nproc)" \
    "${PIP[@]}" wheel --no-build-isolation --no-deps -w "$CACHE" "$src"
  wheel=$(ls "$CACHE"/horovod-$VERSION-*.whl | head -n1)
fi
# --no-deps keeps torch as it is; Horovod's own runtime deps, pinned where constraints.txt pins them.
"${PIP[@]}" install --quiet --no-deps --force-reinstall "$wheel"
"${PIP[@]}" install --quiet -c constraints.txt cloudpickle psutil pyyaml packaging
"$PY" -c 'import horovod, horovod.torch as hvd; print("horovod", horovod.__version__, "installed; gloo built:", hvd.gloo_built())'
