#!/usr/bin/env bash
# usage: bash benchmarks/probes/pack_out.sh DIR
# The lent device returns at most 8 files from $OUT (16 MiB each; a ninth is left out, "count"):
# with more than 8 in DIR, its logs go back as one archive, DIR/logs.tgz (images, archives and
# the tuning store stay beside it).
set -u
dir=${1:?usage: pack_out.sh DIR}
n=$(find "$dir" -maxdepth 1 -type f | wc -l)
if [ "$n" -gt 8 ]; then
  (cd "$dir" && tar czf logs.tgz --remove-files $(ls | grep -v -E '\.(png|tgz)$|^tuning\.json$'))
  echo "packed the logs into $dir/logs.tgz ($n files)"
fi
