// GPU check of the un-gated chunk inverse (src/kernels/kkt_solve) and the forward walk on it
// (src/kernels/walk_a_fwd), which nothing calls yet: steps 1 and 2 of
// docs/design/gdn-hopper-v8-plan.md, checked and timed on their own before the op uses them.
#pragma once

// A (= (I + diag(beta) strict-lower(K K^T))^-1) and G of random packs (edge document
// lengths, beta near 0 and 1, bf16 beta, correlated keys, more than 32 documents) against a
// double-precision solve of the same bf16 keys (relative RMS <= 4e-3, max error <= 8e-3 max|ref|:
// A is rounded once to bf16); then o and the final state of kkt_solve + walk_a_fwd and of
// intra_fwd + state_output_fwd against a token-by-token FP64 recurrence on three packs (g in
// (-0.5, 0), in (-20, 0), and 0; an initial state): the accuracy gate (1e-2 / 2e-2) and no more
// than 1.5x the error of today's forward. One line per case; returns whether all pass.
bool check_kkt_solve();

// The forward's median time at workload A (4 documents, 262,144 tokens, 16 / 48 heads) both ways:
// intra_fwd + state_output_fwd (today's) and kkt_solve + walk_a_fwd (steps 1 and 2 of the plan).
void time_kkt_solve();
