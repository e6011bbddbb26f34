#!/bin/sh
# A one-off transfer of SRC over N source DTNs with plain ssh: shard I runs on source host I and
# sends to destination receiver I. Every host computes the same partition of the (shared) tree.
#   examples/ssh/run-shards.sh /data/out run42 "dtn-out-0 dtn-out-1 dtn-out-2" "dtn-in-0:5000 dtn-in-1:5000 dtn-in-2:5000"
set -eu
SRC=$1 NAME=$2 SOURCES=$3 RECEIVERS=$4
N=$(echo $SOURCES | wc -w)
I=0
for host in $SOURCES; do
    dest=$(echo $RECEIVERS | cut -d' ' -f$((I + 1)))
    ssh "$host" automdt transfer "$SRC" "$dest/$NAME" --shard "$I/$N" --secret-file /etc/automdt/secret --json \
        > "$NAME-shard$I.json" &
    I=$((I + 1))
done
rc=0
for job in $(jobs -p); do wait "$job" || rc=1; done
exit $rc
