"""data: where a step's tokens come from — the synthetic chain (synthetic.py) and files (files.py: nanoGPT's
.bin, text as bytes); each a function of (seed, step). Their specs are checked before launch by
config/data_spec.py; engine/batches.py hands each rank its rows."""
