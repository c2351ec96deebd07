#!/usr/bin/env bash
# ncu of the batch-32 decode's wide dense and expert GEMVs (bf16 plan).
set -u
C=$PWD/build-gpu-carry
tar -xJf .gpucarry/carry.tar.xz
export LD_LIBRARY_PATH=$C/lib
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
for k in linear_split_wide expert_up_wide linear_wide; do
  $NCU --clock-control none --graph-profiling node -k "regex:dk[0-9]+_op0_$k\$" --launch-skip 40 --launch-count 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy --section LaunchStats \
    $C/bin/nfrun bench $C/plans/nano-bf16.nfb --backend cuda --random-weights --seed 1 --batch 32 \
    --prefill 16 --context 1024 --steps 4 > $OUT/ncu_$k.txt 2>&1
  echo "== $k"; grep -E "Duration|DRAM Throughput|L2 Cache Throughput|L1/TEX Hit|L2 Hit|Memory Throughput|Registers Per|Achieved Occupancy|Stall|Warp Cycles Per Issued" $OUT/ncu_$k.txt | head -20
done
