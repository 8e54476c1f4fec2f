"""engine/checkpoint: saving and resuming the whole training state with torch.distributed.checkpoint.

files.py        the layout on disk and what makes a checkpoint complete (no torch: the launcher reads it)
layout.py       where each element of the global state lives on this rank (resharding)
save_load.py    save and load, every rank its pieces
"""
