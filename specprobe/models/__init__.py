"""Models: the only code that reads checkpoints or calls from_pretrained, and the forward
passes over them.

Here:   `loader`          a spec (a checkpoint folder, a GGUF file, the built-in
                          `smollm2`) to a LoadedModel; `check`'s ModelInfo without weights
        `anatomy`         where a transformers model keeps its decoder layers, norm, head
                          and cache; layer hooks (on the floor below `precision/`, which
                          walks the same layers)
        `drafters`        drafters built on a model (an independent LM, a layer-skip
                          self-draft) and the one factory from a drafter spec to a drafter
        `heads/`          head drafters: Medusa, EAGLE-1/2/3, MTP
        `kvcache`         one KV cache over a batch of rows that advance at different
                          speeds (the real loop's stream)
        `cache_check`     whether a GGUF dequantisation cache entry is whole
        `tree_draft`, `tree_attention`  one round of tree drafting and its tree mask

Not here: the `Drafter` interface and the drafters that need no model (n-gram, suffix
trees, SGLang's NGRAM: `drafters/`, the floor below); the weights and KV cache in their
served precision (RTN quantization, quantized checkpoints, GGUF held as blocks, fp8 and
ggml KV: `precision/`)."""
