// GPU check of the fused backward on its own, outside the op (step 4 of
// docs/design/gdn-hopper-fused-walks.md: kkt_solve -> the h-walk (walk_a_fwd without o) ->
// walk_a_bwd).
#pragma once

// dq, dk (this kernel's per-value-head terms summed over each q/k head's value heads on the host),
// dv, dg, dbeta and dh0 of random packs (edge document lengths, grouped value heads, initial and
// final state gradients, g = -20 and 0, beta near 0 and 1, more than 32 documents) against the
// FP64 chunked reference on the same bf16 / fp32 inputs, with the accuracy gate of
// workloads.json (relative RMS <= 1e-2, max error <= 2e-2 max|ref|, all finite); outputs are
// poisoned before each run. Both forms of the reverse walk (the walk; the split: its dS-walk,
// then its chunk pass), and the split's gradients bitwise the walk's. One line per case and form;
// returns whether all pass.
bool check_walk_bwd();

// The three stages' median times, the reverse walk in each form, at workload A (4 documents,
// 262,144 tokens, 16 / 48 heads) and at the main job's batch ("job": 48 walks).
void time_walk_bwd();
