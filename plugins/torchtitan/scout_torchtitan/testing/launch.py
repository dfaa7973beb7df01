"""TorchTitan's entry point with SCOUT's CPU shims installed (tests and the CPU example).

Use it exactly like ``-m torchtitan.train``::

    torchrun --nproc-per-node 6 -m scout_torchtitan.testing.launch \\
        --module scout_torchtitan.testing --config tiny_llama3 \\
        --parallelism.spmd_backend partial_dtensor \\
        --parallelism.data_parallel_replicate_degree 3 --parallelism.tensor_parallel_degree 2 \\
        --hf_assets_path ASSETS/tokenizer --dataloader.dataset_path ASSETS/c4_test

The shims must be in place before ``torchtitan.train`` is imported (it imports the
trainer, which imports the triton kernels and copies the device type), which is
all this module adds.
"""

from __future__ import annotations

from scout_torchtitan.testing.shims import install_cpu_shims


def main() -> None:
    """Install the CPU shims this machine needs, then run ``torchtitan.train.main()``."""
    install_cpu_shims()
    from torchtitan.train import main as titan_main

    titan_main()


if __name__ == "__main__":
    main()
