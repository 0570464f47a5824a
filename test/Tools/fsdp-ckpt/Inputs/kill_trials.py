#!/usr/bin/env python3
"""SIGKILL one rank at a random point of a save, many times over.

Each trial overwrites a committed checkpoint (seed OLD) with a new save
(seed NEW) under mpirun, one random rank SIGKILLing itself at its Nth
write, fsync or rename (the commit's renames included). Afterwards the
checkpoint directory must load bit-exact with OLD (or, only when the kill
came after the commit, verify and load with NEW), and the staging directory
left behind must be refused as incomplete.

With ASYNC ("async"), every save is `--async` and overwrites its buffers
with other values as soon as it returns: the kills land in the background
writes, fsync and commit, and a completed save must hold NEW, not the
values written over its buffers.

usage: kill_trials.py FSDP_CKPT PLAN WORLD DIR TRIALS SEED [async]
"""
import random
import subprocess
import sys

OLD, NEW, SCRIBBLE = 3, 9, 12


def run(argv, **kwargs):
    return subprocess.run(argv, capture_output=True, text=True, **kwargs)


def main(ckpt, plan, world, root, trials, seed, asynchronous):
    rng = random.Random(seed)
    extra = ["--async", "--scribble-after-return", str(SCRIBBLE)] if asynchronous else []
    mpirun = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(world)]
    result = run(mpirun + [ckpt, "save", "--plan", plan, "--dir", root, "--fill", str(OLD), "--overwrite"])
    if result.returncode:
        print("FAIL: the first save failed:", result.stderr)
        return 1
    outcomes = {"old": 0, "new": 0}
    for trial in range(trials):
        op = rng.choice(["write", "write", "sync", "rename"])
        rank = 0 if op == "rename" else rng.randrange(world)
        # The writes a rank surely makes: a small model's rank file goes out in
        # one direct write (its items share a block); rank 0 then writes the
        # commit's three files.
        nth = {"rename": rng.randint(1, 3), "sync": 1,
               "write": rng.randint(1, 4) if rank == 0 else 1}[op]
        fault = f"{op}:{nth}:KILL"
        save = run(mpirun + [ckpt, "save", "--plan", plan, "--dir", root, "--fill", str(NEW),
                             "--overwrite", "--inject-fault", fault, "--inject-fault-rank", str(rank)] + extra,
                   timeout=120)
        old = run(mpirun + [ckpt, "load", "--plan", plan, "--dir", root, "--check", str(OLD)])
        if old.returncode == 0:
            outcomes["old"] += 1
        else:
            # Only a save that completed may have replaced the checkpoint.
            new = run(mpirun + [ckpt, "load", "--plan", plan, "--dir", root, "--check", str(NEW)])
            verified = run([ckpt, "verify", root])
            if save.returncode != 0 or new.returncode or verified.returncode:
                print(f"FAIL: trial {trial} ({fault} on rank {rank}): the checkpoint is neither "
                      f"the old one nor a complete new one\nload (exit {old.returncode}): "
                      f"{old.stderr}\nsave (exit {save.returncode}): {save.stderr}")
                return 1
            outcomes["new"] += 1
            # Restore the old checkpoint for the next trial.
            run(mpirun + [ckpt, "save", "--plan", plan, "--dir", root, "--fill", str(OLD), "--overwrite"])
        staging = root + ".fsdp-staging"
        refused = run(mpirun + [ckpt, "load", "--plan", plan, "--dir", staging])
        if refused.returncode == 0:
            print(f"FAIL: trial {trial}: the interrupted save's staging directory loaded")
            return 1
        if save.returncode == 0 and old.returncode == 0:
            print(f"FAIL: trial {trial} ({fault}): the save reported success but nothing changed")
            return 1
    print(f"OK: {trials} trials, previous checkpoint intact after {outcomes['old']}, "
          f"completed before the kill {outcomes['new']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5]),
                  int(sys.argv[6]), sys.argv[7:] == ["async"]))
