#!/usr/bin/env bash
# Carry Triton's compiled kernels from one lent-machine call to the next (each call may start a
# fresh machine; compiling is most of a cold call's time: the indexer's GPU tests, a tune).
#   bash benchmarks/probes/tcache.sh pack OUT   # at a call's end: $TRITON_CACHE_DIR, pruned to
#                                               # what a cache hit loads (each kernel's metadata
#                                               # .json, its .cubin / .hsaco and the group
#                                               # files), as OUT/tcache.tgz (at most 16 MiB
#                                               # come back a file)
#   bash benchmarks/probes/tcache.sh restore    # at the next call's start, the archive carried
#                                               # in as .tcarry/tcache.tgz (copy it there and
#                                               # name .tcarry in carry), unpacked in place
# A hit needs the same kernel source, Triton, target and cache path: the group files name their
# members by absolute path, so the repository root must be the same on both machines. A kernel
# that misses is compiled as usual; nothing is ever wrong, at worst nothing is saved.
set -u
dir=${TRITON_CACHE_DIR:-$PWD/.tcache}
case "${1:-}" in
  pack)
    out=${2:?usage: tcache.sh pack OUT}
    [ -d "$dir" ] || { echo "tcache: no $dir"; exit 0; }
    find "$dir" -type f ! -name '*.json' ! -name '*.cubin' ! -name '*.hsaco' -delete
    n=$(find "$dir" -name '*.cubin' -o -name '*.hsaco' | wc -l)
    tar czf "$out/tcache.tgz" -P "$dir"
    size=$(stat -c %s "$out/tcache.tgz")
    echo "tcache: $n kernels packed from $dir into $out/tcache.tgz ($((size / 1024)) KiB)"
    if [ "$size" -gt $((16 * 1024 * 1024)) ]; then
      rm -f "$out/tcache.tgz"; echo "tcache: over 16 MiB, not kept (the device returns no more)"
    fi ;;
  restore)
    if [ -f .tcarry/tcache.tgz ]; then
      tar xzf .tcarry/tcache.tgz -P
      echo "tcache: $(find "$dir" -name '*.cubin' -o -name '*.hsaco' | wc -l) kernels in $dir"
    fi ;;
  *) echo "usage: tcache.sh pack OUT | restore"; exit 2 ;;
esac
