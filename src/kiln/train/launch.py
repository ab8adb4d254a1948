"""The torchrun command line the smoke and train rules launch with (torch-free, for the Snakefile).

One node: `torchrun --standalone` (a private rendezvous on a free local port). Several nodes: every
node runs the same rule with its own train.node_rank and node 0's host:port as train.rdzv_endpoint
(torchrun's static rendezvous, MASTER_ADDR/MASTER_PORT style); world size is nnodes x nproc_per_node.
"""

from __future__ import annotations

import shlex


def torchrun_command(train: dict) -> str:
    args = ["torchrun", f"--nproc_per_node={train['nproc_per_node']}"]
    if train["nnodes"] == 1 and not train["rdzv_endpoint"]:
        args.append("--standalone")
    else:
        args += [f"--nnodes={train['nnodes']}", f"--node_rank={train['node_rank']}",
                 "--rdzv_backend=static", f"--rdzv_endpoint={train['rdzv_endpoint']}"]
    return shlex.join(args)
