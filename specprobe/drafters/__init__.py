"""Drafters: what a drafter is, and the drafters that need no model.

Here:   `base`          the interface every drafter shares: `Drafter` (the base class of
                        an independent model, a layer-skip self-draft, Medusa/MTP/EAGLE
                        heads), `TargetPass` (the target's teacher-forced outputs a
                        drafter reads), `ModelInfo` (a model's facts read without its
                        weights) and `Target` (what a drafter reads of the target it
                        drafts for)
        `ngram`         the engines' n-gram (prompt lookup) drafters: vLLM's, llama.cpp's
                        types and their comma lists; the spec grammar (`is_ngram_spec`)
        `sglang_ngram`  SGLang's NGRAM trie and its draft tree
        `suffix`        vLLM's suffix decoding's suffix trees
        `ngram_mix`     llama.cpp's n-gram types beside a draft model (`types+model`)

Not here: anything that reads weights. The drafters built on a model (independent LMs,
layer-skip self-drafts: `models/drafters.py`; heads: `models/heads/`) and the loader
live in `models/`; an n-gram drafter's walk along the references is `probe/ngram.py`,
its draft source in the real loop `simulate/ngram_source.py`.

Why the interface lives here: this package sits on the floor below `models/`
(docs/architecture.md), so the model drafters in `models/` and the model-free ones
beside it both import `base` pointing down. It reads nothing from `models/`: the target
a drafter is paired with is named by the `Target` protocol, which
`models.loader.LoadedModel` satisfies, so the interface needs no import of the loader
(that import ran in a circle: the loader reads `ModelInfo` from here)."""
