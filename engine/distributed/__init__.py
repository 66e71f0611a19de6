"""A model's layers pipelined over several hosts with mlx.distributed, each streaming its own layers' experts."""
