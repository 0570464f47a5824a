#!/usr/bin/env python3
"""Prints an fsdp-model-v1 description of a toy mixture-of-experts model.

One MoE layer: a dense embedding and router sharded on the whole world
(dp = WORLD), and an experts unit sharded on its expert mesh, a view of the
world whose last axis is expert parallelism. Each rank describes only its
own E / EP experts, under local names, as Megatron-FSDP holds them.

  moe_model.py WORLD VIEW EXPERTS [NAMING] [PLACEMENTS] [ROUTER_ROWS]
  moe_model.py 4 edp=2,ep=2 4                 # EP 2 x EDP 2, 2 experts a rank
  moe_model.py 4 erep=2,edp=1,ep=2 4 grouped replicate,shard   # HSDP experts
"""
import json
import sys


def main():
    world = int(sys.argv[1])
    view = [(name, int(size)) for name, size in
            (axis.split("=") for axis in sys.argv[2].split(","))]
    experts = int(sys.argv[3])
    naming = sys.argv[4] if len(sys.argv) > 4 else "grouped"
    placements = (sys.argv[5].split(",") if len(sys.argv) > 5
                  else ["shard"] * (len(view) - 1))
    # The router's rows are the expert count unless given (to test a load
    # that lacks experts while every other key fits).
    router_rows = int(sys.argv[6]) if len(sys.argv) > 6 else experts
    expert_parallel = view[-1][1]
    per_rank = experts // expert_parallel

    # Rows that do not divide evenly, so pieces straddle shard boundaries.
    fc1 = {"name": "weight", "shape": [7, 6], "dtype": "bf16"}
    fc2 = {"name": "weight", "shape": [5, 7], "dtype": "bf16"}
    if naming == "grouped":
        expert_unit_children = [
            {"name": "linear_fc1",
             "params": [dict(fc1, name=f"weight{i}") for i in range(per_rank)]},
            {"name": "linear_fc2",
             "params": [dict(fc2, name=f"weight{i}") for i in range(per_rank)]},
        ]
    else:
        expert_unit_children = [{
            "name": "local_experts",
            "children": [{"name": str(i), "children": [
                {"name": "linear_fc1", "params": [fc1]},
                {"name": "linear_fc2", "params": [fc2]},
            ]} for i in range(per_rank)],
        }]
    model = {
        "format": "fsdp-model-v1",
        "mesh": [{"name": "dp", "size": world}],
        "expert_meshes": [{
            "name": "experts",
            "axes": [{"name": name, "size": size} for name, size in view],
            "experts": view[-1][0],
        }],
        "optimizer": {"kind": "adamw", "lr": 0.001, "weight_decay": 0.01},
        "module": {
            "name": "",
            "fully_shard": {"placements": ["shard"], "main_params_dtype": "f32"},
            "children": [
                {"name": "embed", "params": [
                    {"name": "weight", "shape": [11, 6], "dtype": "bf16"}]},
                {"name": "mlp", "params": [
                    {"name": "router", "shape": [router_rows, 6], "dtype": "bf16"}],
                 "children": [{
                     "name": "experts",
                     "fully_shard": {"placements": placements,
                                     "main_params_dtype": "f32"},
                     "experts": {"mesh": "experts", "count": experts,
                                 "naming": naming},
                     "children": expert_unit_children,
                 }]},
            ],
        },
    }
    json.dump(model, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
