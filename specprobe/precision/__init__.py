"""Precision as served: the weights and KV cache in the formats the engines serve them.

Here:   `quant`             RTN weight quantization simulated on a loaded model (fp8,
                            int8, int4, W8A8), fp8 KV rounding, the full-precision what-if
                            (`as_loaded`), quantized checkpoints built without their engine
        `qlinear`           `QuantLinear`: a decoder linear held quantized in memory and
                            dequantized per layer at each forward; W8A8 activation
                            quantization; the walks over a model's decoder linears and
                            held layers
        `quant_checkpoint`  quantized checkpoints' formats from disk (compressed-tensors
                            fp8/int/packed int, GPTQ, AWQ GEMM), dequantized as their
                            formats specify
        `ggml_blocks`       ggml's block types (Q8_0, Q4_K, …) read back as transformers'
                            GGUF loader reads them
        `gguf_held`         a GGUF built empty and filled from the file, its decoder
                            linears held as their ggml blocks
        `kv_served`         the KV cache as the engines store it (vLLM's fp8, llama.cpp's
                            ggml types)

Not here: loading a model (`models/loader.py` calls in here for a quantized checkpoint or
a held GGUF), finding a model's layers (`models/anatomy.py`, on the floor below this
package), and what precision costs or changes in a run (`probe/served.py`, the
full-precision what-if; `--target-quant` and friends are settings, `settings/`)."""
