// GPU check of the un-gated chunk inverse (src/kernels/kkt_solve) on its own; the stages that
// use it are checked through the op by the GDN check (gdn_check.cpp).
#pragma once

// A (= (I + diag(beta) strict-lower(K K^T))^-1) and G of random packs (edge document lengths,
// beta near 0 and 1, bf16 beta, correlated keys, more than 32 documents) against a
// double-precision solve of the same bf16 keys (relative RMS <= 4e-3, max error <= 8e-3 max|ref|:
// A is rounded once to bf16). One line per case; returns whether all pass.
bool check_kkt_solve();

// kkt_solve's median time at workload A (4 documents, 262,144 tokens, 16 / 48 heads).
void time_kkt_solve();
