#!/usr/bin/env bash
# Two saves of one target at once. The first pauses on its first data write
# (--inject-fault write:1:PAUSE) while holding its claim on the target; the
# second starts then. Prints one line per step for FileCheck. FIRST_FLAGS go
# to the first save of each pair (--async: its claim is held by its
# background thread).
#   concurrent_saves.sh PLAN WORKDIR FSDP_CKPT [FIRST_FLAGS...]
set -u
plan=$1
work=$2
ckpt=$3
shift 3
first_flags=("$@")

wait_for_claim() {
  for _ in $(seq 200); do
    [[ -e "$1.fsdp-lock" ]] && return 0
    sleep 0.05
  done
  echo "no claim appeared on $1"
  return 1
}

# 1. A new target: the first commits, the second fails at once with busy.
"$ckpt" save --plan "$plan" --dir "$work/a" --fill 1 --inject-fault write:1:PAUSE \
  "${first_flags[@]}" > "$work/a-first.txt" 2>&1 &
first=$!
wait_for_claim "$work/a"
start=$(date +%s%N)
"$ckpt" save --plan "$plan" --dir "$work/a" --fill 2 2>&1
echo "second save: exit $?"
echo "second save took $(( ($(date +%s%N) - start) / 1000000 )) ms"
wait "$first"
echo "first save: exit $?"
"$ckpt" verify "$work/a" > /dev/null 2>&1
echo "verify: exit $?"
"$ckpt" load --plan "$plan" --dir "$work/a" --check 1 > /dev/null 2>&1
echo "the first save's values: exit $?"
echo "lock files left: $(ls -a "$work" | grep -c fsdp-lock)"

# 2. --overwrite over a good checkpoint; the save holding the claim dies:
#    the good checkpoint survives intact, and the dead claim blocks nobody.
"$ckpt" save --plan "$plan" --dir "$work/b" --fill 5 > /dev/null
"$ckpt" save --plan "$plan" --dir "$work/b" --fill 1 --overwrite \
  --inject-fault write:1:PAUSE "${first_flags[@]}" > /dev/null 2>&1 &
first=$!
wait_for_claim "$work/b"
"$ckpt" save --plan "$plan" --dir "$work/b" --fill 2 --overwrite 2>&1
echo "second overwrite: exit $?"
# The kill and the wait with the shell's stderr away: bash prints its
# "Killed" notice when it reaps the job, which may be at either.
{
  kill -KILL "$first"
  wait "$first"
  killed=$?
} 2> /dev/null
echo "first overwrite killed: exit $killed"
"$ckpt" load --plan "$plan" --dir "$work/b" --check 5 > /dev/null 2>&1
echo "the good checkpoint: exit $?"
"$ckpt" verify "$work/b" > /dev/null 2>&1
echo "verify after the kill: exit $?"
"$ckpt" save --plan "$plan" --dir "$work/b" --fill 6 --overwrite > /dev/null 2>&1
echo "a later overwrite: exit $?"
"$ckpt" load --plan "$plan" --dir "$work/b" --check 6 > /dev/null 2>&1
echo "its values: exit $?"
