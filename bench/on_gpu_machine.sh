#!/usr/bin/env bash
# The checks that need the GPU machine (16 cores, one GPU), run there through the device tool from
# the repository root with its own python3 (torch with CUDA, pyarrow, pillow; no Mosaic):
#   tests/gpu, then the image loader's worker scaling on CPU and onto the GPU.
# Each step has its own time limit so that one stuck step still leaves the others' figures.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
out=${OUT:-/tmp/hora-gpu}
mkdir -p "$out"
nvidia-smi -L; nproc; python3 -c 'import torch, pyarrow; print("torch", torch.__version__, "pyarrow", pyarrow.__version__)'
timeout 170 python3 -m pytest -q -p no:cacheprovider tests/gpu --timeout 150 2>&1 | tail -40 | tee "$out/gpu_tests.log"
timeout 200 python3 bench/data_images.py --rows 8000 --workers 1,2,4,8,14 --rounds 3 \
    --contenders hora,torch 2>&1 | tee "$out/images_cpu.log"
timeout 90 python3 bench/data_images.py --rows 8000 --workers 4,14 --rounds 3 \
    --contenders hora,torch --device cuda 2>&1 | tee "$out/images_cuda.log"
timeout 120 python3 bench/data_images.py --rows 8000 --ranks 2 --workers 6 --rounds 3 \
    --contenders hora,torch 2>&1 | tee "$out/images_2_ranks.log"
timeout 120 python3 bench/data_images.py --rows 8000 --ranks 4 --workers 2 --rounds 3 \
    --contenders hora,torch 2>&1 | tee "$out/images_4_ranks.log"
timeout 120 python3 bench/data_images.py --workload text --rows 40000 --group 1000 --batch 256 \
    --workers 1,4,14 --rounds 3 --contenders hora,torch 2>&1 | tee "$out/text.log"
