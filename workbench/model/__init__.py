"""model: what is trained — the GPT every strategy shards, and its mixture-of-experts MLP. It knows nothing
of parallelism: strategies swap its modules afterwards (engine/parallelize.py)."""
