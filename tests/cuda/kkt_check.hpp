// GPU check of the un-gated chunk inverse (src/kernels/kkt_solve) and the forward walk on it
// (src/kernels/walk_a_fwd), which nothing calls yet: steps 1 and 2 of
// docs/design/gdn-hopper-v8-plan.md, checked and timed on their own before the op uses them.
#pragma once

// A (= (I + diag(beta) strict-lower(K K^T))^-1 diag(beta)) and G of random packs (edge document
// lengths, beta near 0 and 1, bf16 beta, more than 32 documents) against a double-precision solve
// of the same bf16 keys; prints one line per case and returns whether all pass the accuracy gate
// (relative RMS <= 1e-2, max error <= 2e-2 max|ref|); then o and the final state of kkt_solve +
// walk_a_fwd against intra_fwd + state_output_fwd on three packs (g in (-0.5, 0), in (-20, 0), and
// 0; an initial state), with the same gate.
bool check_kkt_solve();

// The forward's median time at workload A (4 documents, 262,144 tokens, 16 / 48 heads) both ways:
// intra_fwd + state_output_fwd (today's) and kkt_solve + walk_a_fwd (steps 1 and 2 of the plan).
void time_kkt_solve();
