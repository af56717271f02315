// GPU check of the un-gated chunk inverse (src/kernels/kkt_solve), which nothing calls yet: step
// 1 of docs/design/gdn-hopper-v8-plan.md, checked and timed on its own before the walks use it.
#pragma once

// A and G of random packs (edge document lengths, beta near 0 and 1, bf16 beta, more than 32
// documents) against a double-precision solve of the same bf16 keys; prints one line per case
// and returns whether all pass the accuracy gate (relative RMS <= 1e-2, max error <= 2e-2 max|ref|).
bool check_kkt_solve();

// The kernel's median time at workload A (4 documents, 262,144 tokens, 16 / 48 heads), next to
// intra_fwd's on the same inputs (the kernel it is meant to replace).
void time_kkt_solve();
