"""One model over several hosts with mlx.distributed, each host streaming its own experts from its own drives:
a pipeline of layer ranges (stage.py) or expert parallelism (experts.py); launch.py starts the ranks,
model.py serves reviews over them (`serve --hosts`)."""
