"""optim: the updaters together — gradients in, new parameters out.

updater.py          the Updater contract, AdamW on whole or tensor-parallel parameters, ZeRO's sharded one,
                    the global gradient norm
adamw.py            torch's AdamW kernels without torch.optim.Optimizer; apply_update (clip, skip, step)
mixed_precision.py  16-bit parameters, fp32 masters, fp16 loss scaling
offload.py          ZeRO-Offload: the update on the host
onebit_adam.py      1-bit Adam: compressed momentum after a warm-up
lr_schedule.py      warm-up and cosine decay
"""
