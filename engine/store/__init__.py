"""The on-disk model.

- `gguf_*`: GGUF files -> plain mlx-lm model directories (the dense default model).
- The expert store (docs/store.md): `importer` (safetensors MoE checkpoint -> store, layer by
  layer), `manifest` (the store's manifest and expert file layout), `loader` (store -> model
  with every expert in RAM), `placement` (which drives hold which experts), `upkeep`
  (verify, measure routing, re-place), `synth` (synthetic checkpoints), `families` (what the
  store needs from an mlx-lm model family), `safetensors_io` (one tensor at a time).
- `moefy`: the sparse default model (MoEfication of the dense one; bench/moefy_study.py measures its cost).
- `data/`: shipped texts (calibration and evaluation for MoEfication, routing prompts for placement).
"""
