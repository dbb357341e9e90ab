"""The metric catalogue: the single source of metric names, units and meaning.

Rules, reports and docs read it; the rules loader rejects a condition that names a
metric not listed here. Names carry unit and direction (`_nats`, `_tokens`, `_frac`).
Per-depth arrays are indexed from depth 1 in every report.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    name: str
    unit: str  # "frac" (0..1), "nats", "tokens", "ratio", "count", "bool", "x" (speedup), "temp", "se" (standard errors)
    higher_is_better: bool | None  # None: neither (a setting or a fact)
    source: str  # check | diagnose | simulate | compare | monitor
    description: str


def _m(name: str, unit: str, hib: bool | None, source: str, description: str) -> Metric:
    return Metric(name, unit, hib, source, description)


_METRICS: list[Metric] = [
    # --- alignment (check): computed without any forward pass -----------------------
    _m("vocab_size_target", "count", None, "check", "Rows of the target's LM head (its vocabulary as the engine sees it)."),
    _m("vocab_size_draft", "count", None, "check", "Rows of the drafter's LM head (or draft vocabulary for EAGLE-3)."),
    _m("vocab_size_diff", "count", False, "check", "|vocab_size_target − vocab_size_draft|; engines tolerate ≤128 rows of padding."),
    _m("tokenizer_size_diff", "count", False, "check", "|len(target tokenizer) − len(drafter tokenizer)|."),
    _m("token_id_mismatch_count", "count", False, "check", "Target tokens whose id in the drafter's tokenizer differs or is missing."),
    _m("token_id_mismatch_frac", "frac", False, "check", "token_id_mismatch_count / target tokenizer size."),
    _m("bos_id_mismatch", "bool", False, "check", "1 when the BOS token ids differ."),
    _m("eos_id_mismatch", "bool", False, "check", "1 when the EOS token id sets differ."),
    _m("pad_id_mismatch", "bool", False, "check", "1 when the PAD token ids differ."),
    _m("unk_id_mismatch", "bool", False, "check", "1 when the UNK token ids differ."),
    _m("special_tokens_mismatch_count", "count", False, "check", "Added/special tokens present on one side only or with another id."),
    _m("chat_template_mismatch", "bool", False, "check", "1 when the chat templates differ (one missing counts)."),
    _m("normalizer_mismatch", "bool", False, "check", "1 when the tokenizers' normalizers differ."),
    _m("pretokenizer_mismatch", "bool", False, "check", "1 when the tokenizers' pre-tokenizers differ."),
    _m("context_length_target_tokens", "tokens", None, "check", "Target max_position_embeddings."),
    _m("context_length_draft_tokens", "tokens", None, "check", "Drafter max_position_embeddings."),
    _m("context_length_serving_tokens", "tokens", None, "check", "The context the engine serves (a serving config's max_model_len), when known."),
    _m("context_length_deficit_tokens", "tokens", False, "check", "max(0, served context − drafter context): the served context is context_length_serving_tokens when known, else the target's."),
    _m("temperature_target", "temp", None, "check", "Effective target sampling temperature (0 = greedy)."),
    _m("temperature_draft", "temp", None, "check", "Effective drafter sampling temperature (0 = greedy)."),
    _m("temperature_abs_diff", "temp", False, "check", "|temperature_target − temperature_draft|."),
    _m("draft_greedy_target_sampling", "bool", False, "check", "1 when the drafter decodes greedily while the target samples."),
    _m("top_k_mismatch", "bool", False, "check", "1 when the two sides' top-k settings differ."),
    _m("top_p_mismatch", "bool", False, "check", "1 when the two sides' top-p settings differ."),
    _m("draft_own_temperature_diff", "temp", None, "check", "|temperature in the drafter's own generation_config (1.0 when absent) − temperature the engine gives the drafter|; reported only."),
    _m("temperature_config_gap", "temp", False, "check", "Largest − smallest temperature set by the probe config and serving configs (0 when they agree)."),
    _m("sampling_penalties_set", "bool", False, "check", "1 when the target's sampling applies a repetition, frequency or presence penalty."),
    _m("draft_temperature_applies", "bool", None, "check", "1 when the drafter's temperature shapes what the engine proposes (probabilistic drafting); 0 under greedy drafting (argmax q: no temperature moves it)."),
    _m("draft_temperature_ignored", "bool", None, "check", "1 when a drafter temperature is set but the engine drafts greedily, so it changes nothing."),
    _m("engine_vocab_incompatible", "bool", False, "check", "1 when the engine refuses these two vocabularies as they are (vLLM, a draft model: vocab_size differs; llama.cpp: common_speculative_are_compatible fails); null for heads and engines not modelled."),
    _m("engine_draft_unsupported", "bool", False, "check", "1 when the engine refuses to start with this draft model's config (vLLM: a draft model that declares M-RoPE); null for heads and engines not modelled."),
    _m("vocab_shared_frac", "frac", True, "check", "vLLM: share of the target's vocabulary whose token text the drafter's also holds (word-initial space marks made alike): what use_heterogeneous_vocab lets it propose."),
    _m("hidden_size_mismatch", "bool", False, "check", "1 when a head's input sizes do not fit the target (EAGLE-3 fc: 3·Ht; EAGLE-1 fc and MTP eh_proj: 2·H; Medusa blocks: H)."),
    _m("d2t_invalid_frac", "frac", False, "check", "EAGLE-3: fraction of d2t entries that are out of range or inconsistent with t2d."),
    _m("d2t_all_zero", "bool", False, "check", "EAGLE-3: 1 when the d2t offsets are all zero while the draft vocab is smaller."),
    # --- head drafters (EAGLE-1/2, EAGLE-3, Medusa, MTP): from config.json and tensor headers ---
    _m("d2t_missing", "bool", False, "check", "EAGLE-3: 1 when the draft vocabulary differs from the target's and the checkpoint has no d2t (vLLM then reads draft id i as target id i)."),
    _m("t2d_inconsistent", "bool", False, "check", "EAGLE-3: 1 when t2d's length is not the target vocabulary, it does not mark exactly Vd ids, or it marks ids no draft id maps to."),
    _m("aux_layer_out_of_range", "count", False, "check", "EAGLE-3: auxiliary hidden-state layer ids outside [0, L] for a target of L layers."),
    _m("aux_layers_engines_differ", "bool", False, "check", "EAGLE-3: 1 when vLLM and SGLang feed the head different target layers (explicit ids: SGLang reads id + 1)."),
    _m("norm_before_residual_unset", "bool", False, "check", "EAGLE-3 speculators: 1 when norm_before_residual is absent (vLLM assumes true, the speculators library false)."),
    _m("verifier_mismatch", "bool", False, "check", "EAGLE-3 speculators: 1 when speculators_config.verifier names another model than the target."),
    _m("eagle3_layer_type_unsupported", "bool", False, "check", "EAGLE-3 speculators: 1 when transformer_layer_config.model_type is not one vLLM runs as an EAGLE-3 layer (llama, qwen3)."),
    _m("embedding_unshareable", "bool", False, "check", "EAGLE heads: 1 when the head has no embed_tokens and the target's embedding has another width."),
    _m("head_weights_missing", "count", False, "check", "Medusa heads or MTP layers the config declares whose tensors are not in the checkpoint."),
    _m("spec_tokens_beyond_heads", "count", False, "check", "Serving config's num_speculative_tokens minus the Medusa heads / MTP layers the checkpoint has (0 when within)."),
    _m("rope_theta_target", "count", None, "check", "The target's rope theta (10000 when its config sets none)."),
    _m("rope_theta_head", "count", None, "check", "EAGLE and MTP heads: the rope theta the engine rotates the head's attention with (its own config; MTP: the target's)."),
    _m("head_rope_theta_rel_diff", "ratio", False, "check", "EAGLE and MTP heads: |head rope theta − target rope theta| ÷ target rope theta."),
    _m("head_rope_scaling_mismatch", "bool", False, "check", "EAGLE and MTP heads: 1 when the head's rope scaling (type and parameters) is not the target's."),
    # --- end head drafters ---
    # --- the weights' scale (diagnose: check loads no weights) ---
    _m("embedding_scale_ratio", "ratio", None, "diagnose", "Median RMS of the drafter's embedding rows ÷ the target's (EAGLE-1: the embedding its fc reads raw; 1 for self-drafts)."),
    _m("logit_scale_ratio", "ratio", None, "diagnose", "Drafter ÷ target logit spread per √width for a unit-RMS hidden state through final norm and LM head (independent drafters; 1 for self-drafts)."),
    # --- divergence and acceptance (diagnose): teacher-forced estimates ----------
    _m("accept_prob_mean", "frac", True, "diagnose", "Mean per-position α = Σ min(p, q) = 1 − TV: the alignment measure (how close q is to p), whatever the engine; the acceptance of sampled drafts."),
    _m("relaxed_acceptance_served", "bool", False, "check", "1 when a TensorRT-LLM serving config turns on use_relaxed_acceptance_for_thinking (lossy acceptance in the thinking phase)."),
    _m("best_k_rivals", "count", False, "diagnose", "Draft lengths besides the recommended best K that the cost timing cannot tell apart from it (their speedup ranges, τ over the round cost's quartiles, overlap the fastest K's; best K is the smallest of them): 0 when the best K is measured apart from the others."),
    _m("best_k_rival", "count", None, "diagnose", "The nearest such K."),
    _m("best_k_equivalent_max", "count", None, "diagnose", "The largest K the cost timing cannot tell from the recommended best K (which is the smallest of them): 'K = best_k–best_k_equivalent_max equivalent'."),
    _m("speedup_best_low", "x", True, "diagnose", "The best K's speedup over the round cost's third quartile."),
    _m("speedup_best_high", "x", True, "diagnose", "The best K's speedup over the round cost's first quartile."),
    _m("speedup_rival", "x", True, "diagnose", "The nearest rival K's speedup."),
    _m("speedup_rival_low", "x", True, "diagnose", "The nearest rival K's speedup over the round cost's third quartile."),
    _m("speedup_rival_high", "x", True, "diagnose", "The nearest rival K's speedup over the round cost's first quartile."),
    _m("alignment_errors", "count", False, "diagnose", "Error-level pre-flight (alignment) findings on the pair: 0 means a near-zero acceptance is not a broken pairing."),
    _m("acceptance_lossy", "bool", False, "diagnose", "1 when the engine's verification accepts drafts the target would not sample (SGLang's acceptance thresholds below 1): its output is no longer the target's distribution."),
    _m("accept_threshold_single", "frac", None, "diagnose", "SGLang's speculative_accept_threshold_single the estimate follows (1: exact verification)."),
    _m("accept_threshold_acc", "frac", None, "diagnose", "SGLang's speculative_accept_threshold_acc the estimate follows (1: exact verification)."),
    _m("accept_prob_engine_mean", "frac", True, "diagnose", "Mean acceptance of one draft token under the engine's procedure (the result's procedure): p_target(argmax q) for greedy drafts (vLLM's default, SGLang, llama.cpp, TensorRT-LLM), Σ min(p, q) for sampled ones. τ, speedups and the acceptance rate follow it."),
    _m("greedy_agree_frac", "frac", True, "diagnose", "Fraction of positions where argmax q = argmax p."),
    _m("kl_target_draft_nats", "nats", False, "diagnose", "Mean KL(p ‖ q) in nats on the untruncated tempered softmax; for a head with a smaller draft vocabulary, over that vocabulary (p renormalised over its ids)."),
    _m("kl_target_draft_p90_nats", "nats", False, "diagnose", "90th percentile of per-position KL(p ‖ q)."),
    _m("tv_mean", "frac", False, "diagnose", "Mean total-variation distance between p and q."),
    _m("target_entropy_nats", "nats", None, "diagnose", "Mean entropy of the target distribution."),
    _m("draft_confidence_mean", "frac", None, "diagnose", "Mean drafter confidence max_v q(v)."),
    _m("ngram_proposal_frac", "frac", True, "diagnose", "n-gram drafter: verify steps at which it proposed any token ÷ all verify steps, walked along the references."),
    _m("ngram_draft_tokens_mean", "tokens", None, "diagnose", "n-gram drafter: tokens per proposal (steps that proposed nothing left out)."),
    _m("ngram_accept_frac", "frac", True, "diagnose", "n-gram drafter: accepted ÷ proposed tokens (vLLM's acceptance rate); a deterministic draft is accepted with p_target(draft)."),
    _m("accept_prob_domain_min", "frac", True, "diagnose", "Lowest per-domain mean α."),
    _m("accept_prob_domain_spread", "frac", False, "diagnose", "Highest minus lowest per-domain mean α."),
    _m("accept_prob_aligned_sampling", "frac", True, "diagnose", "What-if: mean α if the drafter sampled with the target's settings (on the what-if sample; null when the settings already match)."),
    _m("accept_prob_config_loss_frac", "frac", False, "diagnose", "Share of α the drafter's sampling settings cost: (α aligned − α) ÷ α aligned, on the what-if sample (null when the settings match)."),
    _m("accept_prob_vocab_ceiling", "frac", True, "diagnose", "What-if: mean target probability mass on ids the drafter can propose at all — an upper bound on α (1 when it can propose every id)."),
    _m("accept_prob_high_entropy", "frac", True, "diagnose", "Mean α over positions where the target entropy is ≥ 2 nats."),
    _m("accept_prob_full_target", "frac", True, "diagnose", "What-if, target served quantized (--target-quant, --kv-cache-dtype fp8): the engine's acceptance of the drafter against the full-precision target, at the same positions."),
    _m("quant_accept_cost", "frac", False, "diagnose", "accept_prob_full_target minus the engine's acceptance against the served (quantized) target at the same positions: the acceptance the target's quantization costs this drafter."),
    _m("target_quant_accept", "frac", True, "diagnose", "The engine's acceptance if the full-precision target drafted for the served (quantized) one: how far quantization moved the verifier (1: not at all)."),
    _m("accept_prob_full_drafter", "frac", True, "diagnose", "What-if, drafter model served quantized (--draft-quant, its fp8 KV cache): the engine's acceptance of the same drafter in full precision against the served target."),
    _m("draft_quant_accept_cost", "frac", False, "diagnose", "accept_prob_full_drafter minus the engine's acceptance of the drafter as served: the acceptance the drafter's own quantization costs."),
    _m("accept_prob_long_context_ratio", "ratio", True, "diagnose", "α at the longest contexts ÷ α at the shortest, within each domain (weighted mean over domains): with --context-lengths, between the longest and the shortest prompt length built; otherwise between context-position buckets of the prompts as given."),
    _m("cond_accept_depth_decay", "ratio", True, "diagnose", "Conditional acceptance at depth 8 ÷ at depth 1 (a_8 / a_1)."),
    _m("tau_tokens", "tokens", True, "diagnose", "Expected tokens per verify step τ(K) at the best K (bonus token included): the renewal estimate, rounds starting where the previous one ended."),
    _m("tau_window_tokens", "tokens", True, "diagnose", "Window estimate of τ at the best K: every start position averaged (runs high when acceptance comes in bursts)."),
    _m("accept_rate_best_k", "frac", True, "diagnose", "(τ(K) − 1) / K at the best K: accepted ÷ drafted."),
    _m("best_k", "count", None, "diagnose", "Draft length K in 1..k_max to recommend: the highest estimated speedup, or, where the cost timing cannot tell several Ks apart, the smallest of them."),
    _m("speedup_best", "x", True, "diagnose", "Estimated speedup at the best K: τ(K) ÷ a round's cost in target steps (K·c + v_K, measured; (1 + K·c)·v with --verify-factor)."),
    _m("speedup_best_low", "x", True, "diagnose", "speedup_best with the round cost at its third quartile over the timed repeats."),
    _m("speedup_best_high", "x", True, "diagnose", "speedup_best with the round cost at its first quartile over the timed repeats."),
    _m("speedup_adaptive", "x", True, "diagnose", "Estimated speedup with the adaptive-K confidence threshold."),
    _m("tree_tau_tokens", "tokens", True, "diagnose", "The run's draft tree (--tree or the serving config's): estimated mean acceptance length per round, bonus included (renewal)."),
    _m("tree_speedup", "x", True, "diagnose", "The run's draft tree: estimated speedup, its round priced as drafting steps over topk tokens plus one verify pass over its tokens."),
    _m("tree_chain_tau_tokens", "tokens", True, "diagnose", "The chain of the tree's depth (topk 1): estimated mean acceptance length, beside the tree's."),
    _m("tree_topk", "", None, "diagnose", "The run's tree: candidates per step (SGLang's speculative-eagle-topk)."),
    _m("tree_tokens", "", None, "diagnose", "The run's tree: nodes verified per round, the root included (SGLang's speculative-num-draft-tokens)."),
    _m("tree_rank_tail_share", "", None, "diagnose", "The run's tree: share of depth-1 accepted nodes that were the drafter's rank-3 or lower candidate (what a topk above 2 buys)."),
    _m("tree_speedup_vs_chain", "x", True, "diagnose", "The run's tree speedup ÷ the speedup of the chain of its depth."),
    _m("tree_best_speedup", "x", True, "diagnose", "The best draft tree of the grid (steps, topk, tokens): estimated speedup."),
    _m("tree_best_vs_chain", "x", True, "diagnose", "The best tree's speedup ÷ the best chain's (the K table's best K)."),
    _m("tree_best_steps", "", None, "diagnose", "The best tree of the grid: its depth (speculative-num-steps)."),
    _m("tree_best_topk", "", None, "diagnose", "The best tree of the grid: candidates per step (speculative-eagle-topk)."),
    _m("tree_best_tokens", "", None, "diagnose", "The best tree of the grid: nodes verified, the root included (speculative-num-draft-tokens)."),
    _m("tree_best_vs_own", "x", True, "diagnose", "The best tree's speedup ÷ the run's own tree's."),
    _m("cost_ratio", "ratio", False, "diagnose", "Drafter cost ÷ target cost per decode step at the run's batch size, measured on the device (or --cost-ratio)."),
    _m("verify_factor_best_k", "ratio", False, "diagnose", "v at the best K: the target's pass over K + 1 tokens ÷ one decode step, measured (or --verify-factor)."),
    _m("cost_spread_rel", "ratio", False, "diagnose", "Interquartile range ÷ median of a round's measured cost at the best K: timing noise across interleaved repeats."),
    _m("cost_repeats", "count", True, "diagnose", "Interleaved timing repeats the speedup estimate rests on, at the run's batch size (fewer than 5 when the budget cut the timing short)."),
    _m("cost_batch_size", "count", None, "diagnose", "Batch size the headline costs were timed at (the run's --batch-size)."),
    _m("batch_size_no_speedup", "count", None, "diagnose", "Smallest timed batch size (--batch-sizes) at which no K gives an estimated speedup of 1 or more (0 when every size pays)."),
    _m("speedup_batch_no_speedup", "x", True, "diagnose", "Best estimated speedup at batch_size_no_speedup."),
    _m("num_positions", "count", None, "diagnose", "Scored target positions."),
    _m("num_prompts", "count", None, "diagnose", "Prompts scored."),
    _m("nonfinite_logit_positions", "count", False, "diagnose", "Positions where the target's or the drafter's logits were NaN or +inf (or all −inf); their prompts are left out of every other metric."),
    _m("reference_off_policy", "bool", None, "diagnose", "1 when references are dataset responses (off-policy) rather than target samples."),
    # --- compare (regression gate, SP5xx): candidate result against a baseline result ---
    _m("accept_prob_mean_baseline", "frac", True, "compare", "Baseline's mean α."),
    _m("accept_prob_mean_candidate", "frac", True, "compare", "Candidate's mean α."),
    _m("overall_accept_prob_rel_change", "ratio", True, "compare", "(candidate α − baseline α) / baseline α; negative is worse."),
    _m("accept_prob_rel_drop_frac", "frac", False, "compare", "max(0, −overall_accept_prob_rel_change): the relative drop in mean α."),
    _m("speedup_best_rel_change", "ratio", True, "compare", "Relative change of the estimated best speedup (each side at its own best K; depends on each side's cost timing)."),
    _m("compare_k", "count", None, "compare", "The draft length τ and speedup are compared at: the baseline's best K, or --k / the config's k (the worst of those K)."),
    _m("tau_tokens_rel_change", "ratio", True, "compare", "Relative change of τ at compare_k (renewal estimate when both sides have it)."),
    _m("tau_rel_drop_frac", "frac", False, "compare", "max(0, −tau_tokens_rel_change): the relative drop of τ at compare_k."),
    _m("speedup_rel_change", "ratio", True, "compare", "Relative change of the estimated speedup at compare_k."),
    _m("tau_tokens_rel_change_se", "frac", None, "compare", "Standard error of tau_tokens_rel_change: the difference's, sqrt(se_b² + se_c²) of each side's τ over prompts (the runs taken as independent), ÷ the baseline τ; null when a result carries none."),
    _m("tau_tokens_change_z", "se", None, "compare", "The change of τ at compare_k in standard errors of the difference (signed); beyond ±2 it is more than noise."),
    _m("tau_change_within_noise", "bool", None, "compare", "1 when τ at compare_k moved by less than 2 standard errors of the difference (|tau_tokens_change_z| < 2): a change, or a drop, that may be noise; 0 when beyond, or when a result carries no standard error (then the threshold alone judges)."),
    _m("accept_rate_rel_change", "ratio", True, "compare", "Relative change of the acceptance at compare_k: accepted ÷ drafted tokens (renewal estimate when both sides have it)."),
    _m("accept_rate_rel_change_se", "frac", None, "compare", "Standard error of accept_rate_rel_change (the difference's ÷ the baseline rate); null when a result carries none."),
    _m("accept_rate_change_z", "se", None, "compare", "The change of the acceptance at compare_k in standard errors of the difference; beyond ±2 it is more than noise."),
    _m("speedup_rel_change_se", "frac", None, "compare", "Standard error of speedup_rel_change over prompts (from τ's; the cost timing's own spread not included); null when a result carries none."),
    _m("speedup_change_z", "se", None, "compare", "The change of the speedup at compare_k in standard errors of the difference; beyond ±2 it is more than noise."),
    _m("domain_accept_prob_min_baseline", "frac", True, "compare", "Lowest per-domain α in the baseline (domains present on both sides)."),
    _m("domain_accept_prob_min_candidate", "frac", True, "compare", "Lowest per-domain α in the candidate (domains present on both sides)."),
    _m("domain_worst_accept_prob_baseline", "frac", True, "compare", "Baseline α of the domain whose α dropped most (relative)."),
    _m("domain_worst_accept_prob_candidate", "frac", True, "compare", "Candidate α of the domain whose α dropped most (relative)."),
    _m("domain_worst_rel_drop_frac", "frac", False, "compare", "Relative α drop of that worst domain (0 when no domain dropped)."),
    _m("cond_accept_decay_baseline", "ratio", True, "compare", "Baseline conditional acceptance at the deepest compared depth ÷ at depth 1."),
    _m("cond_accept_decay_candidate", "ratio", True, "compare", "Candidate conditional acceptance at the deepest compared depth ÷ at depth 1."),
    _m("depth_decay_excess", "ratio", False, "compare", "cond_accept_decay_baseline − cond_accept_decay_candidate: > 0 when the candidate's depth curve decays faster."),
    _m("depth_compared", "count", None, "compare", "Deepest draft depth present in both depth curves (indexed from 1)."),
    _m("kl_target_draft_nats_baseline", "nats", False, "compare", "Baseline mean KL(p ‖ q)."),
    _m("kl_target_draft_nats_candidate", "nats", False, "compare", "Candidate mean KL(p ‖ q)."),
    _m("kl_band_worsened", "bool", False, "compare", "1 when the candidate's KL lies in a worse band than the baseline's (band edges from the SP10x rules)."),
    _m("kl_band_boundary_crossed_nats", "nats", None, "compare", "The highest KL band boundary the candidate crossed upward (n/a when none)."),
    # --- end compare ---
    # --- monitoring (monitor, SP4xx): the serving engine's own counters per model_name, ---
    # --- over a sliding window against the trailing baseline window before it ---
    # --- predicted against served (diagnose --against) ------------------------------
    _m("live_accept_rate", "frac", True, "diagnose", "The live server's accepted ÷ drafted over the run's prompts (diagnose --against)."),
    _m("live_accept_rate_predicted", "frac", True, "diagnose", "The prediction at the live server's K: the renewal estimate's accepted ÷ drafted."),
    _m("live_gap_rel", "frac", None, "diagnose", "(live − predicted) ÷ predicted acceptance: below 0 the server accepts less than the pair predicts."),
    _m("live_gap_z", "ratio", None, "diagnose", "(live − predicted) acceptance in standard errors of the difference (both sides' over prompts)."),
    _m("live_known_issue", "bool", False, "diagnose", "1 when the live server's release has a known issue that changes its acceptance at this temperature."),
    _m("monitor_accept_rate", "frac", True, "monitor", "Accepted ÷ drafted tokens over the current window (engine counters or log lines)."),
    _m("monitor_accept_rate_baseline", "frac", True, "monitor", "Accepted ÷ drafted tokens over the trailing baseline window before the current one."),
    _m("monitor_accept_rate_drop_rel", "frac", False, "monitor", "1 − current ÷ baseline acceptance (accepted tokens per draft when only lengths are known)."),
    _m("monitor_mean_accept_len_tokens", "tokens", True, "monitor", "Mean acceptance length 1 + accepted ÷ drafts over the current window (bonus token included)."),
    _m("monitor_mean_accept_len_baseline_tokens", "tokens", True, "monitor", "Mean acceptance length over the baseline window."),
    _m("monitor_depth_decay_ratio", "ratio", True, "monitor", "r_K ÷ r_1 with vLLM's per-position rate r_i = num_accepted_tokens_per_pos[i] ÷ num_drafts, current window."),
    _m("monitor_depth_decay_excess", "frac", False, "monitor", "1 − current ÷ baseline monitor_depth_decay_ratio: how much steeper acceptance falls with depth than in the baseline."),
    _m("monitor_draft_tokens", "count", None, "monitor", "Draft tokens proposed in the current window (nan for gauge-only sources)."),
    _m("monitor_group_accept_rate", "frac", True, "monitor", "monitor_accept_rate of one group of per-request records (--requests --group-by); nan on the row of all requests and for other sources."),
    _m("monitor_accept_rate_request_mean", "frac", True, "monitor", "Request-weighted acceptance: the mean of each request's accepted ÷ drafted tokens over the current window (--requests)."),
    _m("monitor_requests_below_share", "frac", False, "monitor", "Share of the window's requests whose own acceptance is under the request threshold (--requests)."),
    _m("monitor_drift_drop_rel", "frac", False, "monitor", "Fitted fall of acceptance over the run (Theil–Sen slope over windows: 1 − fit(last) ÷ fit(first)); 0 when Mann–Kendall finds no falling trend at 1 %."),
    _m("monitor_change_drop_rel", "frac", False, "monitor", "1 − after ÷ before at the run's CUSUM change point (significant at 1 %); 0 when there is none."),
    # --- end monitoring ---
    # --- simulate (SP6xx calibration): measured by a real draft→verify loop on the same ---
    # --- prompts as the teacher-forced estimate; compared at the deepest K measured ---
    _m("calibration_k", "count", None, "simulate", "The draft length K at which estimate and measurement are compared (the deepest K measured)."),
    _m("tau_measured_tokens", "tokens", True, "simulate", "Measured τ at calibration_k: 1 + Σ_i r_i, r_i = accepted at position i ÷ drafts that proposed it (bonus token included; vLLM's mean acceptance length 1 + accepted ÷ drafts when every draft is K long)."),
    _m("tau_estimated_tokens", "tokens", True, "simulate", "Teacher-forced renewal estimate of τ at calibration_k, from the same prompts."),
    _m("tau_window_estimated_tokens", "tokens", True, "simulate", "Teacher-forced window estimate of τ at calibration_k (every start position averaged)."),
    _m("tau_gap_rel", "ratio", None, "simulate", "(τ estimated − τ measured) ÷ τ measured at calibration_k; > 0 when the estimate is optimistic."),
    _m("tau_gap_rel_abs", "ratio", False, "simulate", "|tau_gap_rel|: how far the teacher-forced estimate is from the real loop."),
    _m("tau_gap_z", "ratio", None, "simulate", "(τ estimated − τ measured) at calibration_k in standard errors of the difference (each side's over prompts, the loop's seeds pooled per prompt)."),
    _m("tau_gap_z_abs", "ratio", False, "simulate", "|tau_gap_z|: within 2 the estimate and the loop agree within their noise."),
    _m("accept_rate_measured", "frac", True, "simulate", "Measured accepted ÷ drafted tokens at calibration_k."),
    _m("num_drafts_measured", "count", None, "simulate", "Draft→verify steps (per row) measured at calibration_k."),
    _m("speedup_measured", "x", True, "simulate", "Measured tokens/s of speculative decoding ÷ plain target decoding of the same prompts, at the best measured K."),
    _m("best_k_measured", "count", None, "simulate", "The measured K with the highest measured speedup."),
    _m("tokens_per_s_measured", "count", True, "simulate", "Generated tokens per second at best_k_measured (all rows of a batch together)."),
    _m("speedup_estimated_cal_k", "x", True, "simulate", "Estimated speedup at calibration_k on these prompts at this token budget: tokens ÷ the expected cost of the rounds the loop runs (renewal counts, final short rounds included, timed costs)."),
    _m("speedup_measured_cal_k", "x", True, "simulate", "Measured speedup at calibration_k: tokens/s against plain target decoding."),
    _m("speedup_gap_rel", "ratio", None, "simulate", "(estimated − measured speedup) ÷ measured at calibration_k; > 0 when the estimate is optimistic."),
    _m("speedup_gap_rel_abs", "ratio", False, "simulate", "|speedup_gap_rel|: how far the estimated speedup is from the real loop's."),
    _m("speedup_adaptive_measured", "x", True, "simulate", "Measured speedup with --adaptive-threshold (drafting stops at the first depth with max q below it)."),
    # --- end simulate ---
]

CATALOG: dict[str, Metric] = {m.name: m for m in _METRICS}


def register(metric: Metric) -> None:
    """Add a metric (used by command families that own their metrics)."""
    if metric.name in CATALOG and CATALOG[metric.name] != metric:
        raise ValueError(f"metric {metric.name!r} registered twice with different definitions")
    CATALOG[metric.name] = metric


def format_value(name: str, value: float | int | None) -> str:
    """Render a metric value with its unit, for messages and tables."""
    if value is None:
        return "n/a"
    metric = CATALOG.get(name)
    unit = metric.unit if metric else ""
    if isinstance(value, float) and value != value:  # nan
        return "nan"
    if unit == "frac":
        return f"{100 * float(value):.1f}%"
    if unit == "nats":
        return f"{float(value):.3f} nats"
    if unit in ("count", "bool"):
        return f"{int(value)}"
    if unit == "tokens":
        v = float(value)
        return f"{int(v)} tokens" if v.is_integer() else f"{v:.2f} tokens"
    if unit == "x":
        return f"{float(value):.2f}×"
    if unit == "temp":
        return f"{float(value):g}"
    if unit == "se":
        return f"{float(value):+.1f} SE"
    return f"{float(value):.3g}"
