#!/bin/bash
# submit.sh CONFIG SHARDS [NODES] - queue a whole bake on a Slurm cluster: the
# tokenize and plan stages here (CPU, seconds), an array job of SHARDS teacher shards,
# then the training step on NODES nodes (default 1) once every shard has succeeded.
#   pipelines/slurm/submit.sh pipelines/examples/basic.mk 8 2
set -euo pipefail
CONFIG=${1:?usage: submit.sh CONFIG SHARDS [NODES]} SHARDS=${2:?SHARDS} NODES=${3:-1}
export CONFIG SHARDS
cd "$(dirname "$0")/../.."
# the plan every shard reads (bk-tokenize, bk-lens): made once, before the array starts
lens=$(make -s -f pipelines/bake.mk CONFIG="$CONFIG" print | grep "/lens-")
make -f pipelines/bake.mk CONFIG="$CONFIG" "$lens"
a=$(sbatch --parsable --array=0-$((SHARDS - 1)) --export=ALL pipelines/slurm/shards.sbatch)
sbatch --dependency=afterok:"$a" --nodes="$NODES" --export=ALL pipelines/slurm/train.sbatch
