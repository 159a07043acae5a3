#!/usr/bin/env bash
# Build llama.cpp's own `llama-server` (parallel slots, continuous batching) for benchmarks/engine_speed.py's
# `llama-server` side, from the llama.cpp source that ships inside the llama-cpp-python sdist (so both
# llama.cpp sides run the same llama.cpp code).
#
#   usage: benchmarks/build_llama_server.sh DEST_DIR [LLAMA_CPP_PYTHON_VERSION] [JOBS]
#   then:  python benchmarks/engine_speed.py --llama-server DEST_DIR/bin/llama-server --sides llama-server,...
#
# Needs: pip (to download the sdist), cmake >= 3.21, ninja, a C++17 compiler; no network beyond the index.
# Options are those of the llama-cpp-python build the benchmark uses (Release, CPU only, OpenMP, no
# -march=native, AVX-512 with VBMI / VNNI / BF16 named explicitly and AMX left off: llama.cpp's AMX path
# crashed on this machine's Xeon). The binary is linked statically against ggml / llama (one file), with no
# curl, no OpenSSL and no web UI (nothing to download at build time). On a CPU without AVX-512, drop the four
# -DGGML_AVX512* flags.
set -euo pipefail

dest=${1:?usage: build_llama_server.sh DEST_DIR [LLAMA_CPP_PYTHON_VERSION] [JOBS]}
version=${2:-0.3.36}
jobs=${3:-2}
mkdir -p "$dest"
dest=$(cd "$dest" && pwd)

sdist="$dest/llama_cpp_python-$version.tar.gz"
if [ ! -f "$sdist" ]; then
    python3 -m pip download --no-deps --no-binary :all: "llama-cpp-python==$version" -d "$dest"
fi
src="$dest/llama_cpp_python-$version/vendor/llama.cpp"
[ -d "$src" ] || tar -xzf "$sdist" -C "$dest"

cmake -S "$src" -B "$dest/build" -G Ninja \
    -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
    -DGGML_NATIVE=OFF -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON \
    -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON
cmake --build "$dest/build" --target llama-server -j "$jobs"
mkdir -p "$dest/bin"
cp "$dest/build/bin/llama-server" "$dest/bin/llama-server"
"$dest/bin/llama-server" --version
echo "built: $dest/bin/llama-server"
