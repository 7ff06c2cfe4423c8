"""Trainer integrations: shardsafe as the checkpoint storage of a trainer.

Each is a module of its own, imported explicitly, and needs its trainer
installed (the optional extras); ``import shardsafe`` never needs them.

- ``shardsafe.integrations.lightning``: PyTorch Lightning ``CheckpointIO``
  plugins, ``ShardsafeCheckpointIO`` and ``ShardsafeAsyncCheckpointIO``
  (``pip install shardsafe[lightning]``).
- ``shardsafe.integrations.transformers``: ``ShardsafeTrainer``, a
  Hugging Face ``transformers.Trainer`` whose checkpoints are shardsafe
  checkpoints (``pip install shardsafe[transformers]``).
- ``shardsafe.integrations.torchtitan``: ``ShardsafeCheckpointManager``,
  torchtitan's checkpoint manager storing through ``shardsafe.dcp``
  (``pip install shardsafe[torchtitan]``).
- ``shardsafe.integrations.deepspeed``: ``save(engine, path)`` /
  ``load(engine, path)`` of a live DeepSpeed ZeRO-0/1/2/3 engine, resharding
  to another DP size (``pip install shardsafe[deepspeed]``).
"""

from __future__ import annotations

import importlib


def require(module: str, extra: str, what: str) -> None:
    """Imports `module`, or raises ImportError naming the pip extra."""
    try:
        importlib.import_module(module)
    except ImportError as e:
        raise ImportError(f"{what} needs the {module!r} package: pip install "
                          f"shardsafe[{extra}] ({e})") from e
