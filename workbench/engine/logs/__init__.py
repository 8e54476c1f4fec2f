"""engine/logs: rank 0's step points for the loggers people watch training with (TensorBoard, W&B)."""
