#!/usr/bin/env bash
# Builds the CUDA-enabled binaries on the dev machine (no GPU needed) into $GPU_BIN/bin
# (default build-gpu), stripped, for tools/gpu/run_all.sh on the H200 (carry: ["$GPU_BIN/bin.tar.xz"] or ["$GPU_BIN"],
# 64 MiB limit). GPU_TREE names the CMake build tree (default build-cuda); give each engineer
# their own GPU_TREE and GPU_BIN so concurrent builds do not overwrite each other.
# libstdc++/libgcc are linked statically; cudart statically; cuBLASLt dynamically (the
# H200 image has the same CUDA 13.0 toolkit); no MPI (the image has no Open MPI: several GPUs
# start with torchrun's RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, NCCL loaded at run time). Targets that do not build are reported and
# skipped, so a broken module elsewhere does not block the parity run.
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
tree="${GPU_TREE:-$root/build-cuda}"
gpu_bin="${GPU_BIN:-build-gpu}"
out="$root/$gpu_bin/bin"
export PATH="$PATH:/usr/local/cuda/bin"
cmake -S "$root" -B "$tree" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDEEPINFER_CUDA=ON \
  -DDEEPINFER_CUDA_ARCHS=90a -DDEEPINFER_TESTS=ON -DDEEPINFER_BENCH=OFF -DDEEPINFER_WERROR=ON -DDEEPINFER_MPI=OFF \
  -DCMAKE_EXE_LINKER_FLAGS="-static-libstdc++ -static-libgcc" > "$tree.configure.log" 2>&1 ||
  { echo "configure failed: see $tree.configure.log"; tail -20 "$tree.configure.log"; exit 1; }
mkdir -p "$out"
# TARGETS (space-separated) builds only those, e.g. TARGETS=deepinfer for a CLI bench run.
if [[ -n "${TARGETS:-}" ]]; then
  read -r -a targets <<< "$TARGETS"
else
  targets=(test_ops deepinfer_cuda_bench deepinfer)
  for t in $(ninja -C "$tree" -t targets all 2>/dev/null | grep -oE "^test_golden[a-z_0-9]*:" | tr -d ':' | sort -u); do
    targets+=("$t")
  done
fi
for t in "${targets[@]}"; do
  if cmake --build "$tree" --target "$t" -j "$(nproc)" > "$tree.$t.log" 2>&1; then
    f=$(find "$tree" -type f -name "$t" -perm -u+x | head -1)
    cp "$f" "$out/$t" && strip "$out/$t" && echo "built $t ($(du -h "$out/$t" | cut -f1))"
  else
    echo "FAILED $t: see $tree.$t.log"; grep -m5 -E "error" "$tree.$t.log"
  fi
done
# Shared libraries from Debian packages that the H200 image lacks (prometheus-cpp for the
# server): copied beside the binaries into $GPU_BIN/lib, which run_all.sh puts on LD_LIBRARY_PATH
# (carry ["$GPU_BIN/bin.tar.xz", "$GPU_BIN/lib"]).
mkdir -p "$root/$gpu_bin/lib"
for f in "$out"/*; do
  ldd "$f" 2>/dev/null | awk '/prometheus-cpp/ {print $3}' | while read -r lib; do cp -L "$lib" "$root/$gpu_bin/lib/"; done
done
du -sh "$root/$gpu_bin"
# The carry limit (64 MiB) counts the tracked files (~40 MB) too, and four stripped binaries are
# ~34 MB: also pack them as $GPU_BIN/bin.tar.xz (~8 MB); carry ["$GPU_BIN/bin.tar.xz"] and
# run_all.sh unpacks it when $GPU_BIN/bin is absent there.
# PACK=0 skips it (minutes of xz on 2 cores when the call carries a hand-picked subset instead;
# one xz stream with a large dictionary and the x86 filter packs tighter, since the binaries share
# most of their code: tar -cf - bin | xz --x86 --lzma2=preset=9e,dict=512MiB -T1).
if [[ "${PACK:-1}" != 0 ]]; then
  tar -C "$root/$gpu_bin" -cJf "$root/$gpu_bin/bin.tar.xz" bin && du -h "$root/$gpu_bin/bin.tar.xz"
fi
