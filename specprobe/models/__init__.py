"""Models: the only code that reads checkpoints or calls from_pretrained.

`loader` turns a spec (a checkpoint folder, a GGUF file, or the built-in `smollm2`) into a
LoadedModel; `drafters` builds drafters (independent LMs, layer-skip self-drafts, and the
head-style interface) on top of a loaded target."""
