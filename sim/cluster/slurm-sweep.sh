#!/usr/bin/env bash
# A dstwin sweep as a Slurm job array: each array task runs one shard, a dependent job merges.
#
#   jid=$(sbatch --parsable --array=0-7 sim/cluster/slurm-sweep.sh study \
#           sim/scenarios/a3-2p1d.toml --vary decode.max_num_seqs=16..64:16 --vary mtp.tokens=0..3)
#   sbatch --dependency=afterok:$jid --wrap 'dstwin report --merge study/shards/*/sweep.csv --out study'
#
# The first argument is the study directory (on a filesystem every node sees); the rest are the
# sweep's scenario and axes. The shard count is the array's size; `dstwin` must be on PATH.
#SBATCH --job-name=dstwin-sweep
#SBATCH --cpus-per-task=4
#SBATCH --output=dstwin-sweep-%A_%a.out
set -euo pipefail
study=$1
shift
k=${SLURM_ARRAY_TASK_ID:?run as a job array: sbatch --array=0-N}
n=${SLURM_ARRAY_TASK_COUNT:?run as a job array}
exec dstwin sweep "$@" --shard "$k/$n" --out "$study/shards/shard-$k" \
    --jobs "${SLURM_CPUS_PER_TASK:-1}" --quiet
