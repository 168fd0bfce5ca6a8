"""The model runtime of the default CPU mode: a lean forward pass over a KV cache written in
place (`llama`), SpecLens's C++ kernels for a few rows at a time (`rowlinear`, `kernels/`),
oneDNN's packed output layer where the kernel cannot build (`packed`), and `forward`, which
picks between them and the model's own forward."""
