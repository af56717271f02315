// Does a programmatic dependent launch (PDL) overlap its primary on the GPU at hand, and on which
// streams? walk_a_bwd relies on it to start beside the h-walk (docs/perf-notes.md). A primary grid
// whose block 0 runs ~20 ms and whose other blocks exit at once, every block calling
// launch_dependents (ptx.cuh, as the h-walk does) first; then a secondary (launched with
// programmatic stream serialization) and an ordinary third kernel, each recording when it
// started. Prints, per stream kind, whether the secondary started before the primary's end
// (overlap) and whether the ordinary kernel waited for the primary.
//   nvcc -gencode=arch=compute_90a,code=sm_90a -I src -o /tmp/pdl_probe tools/pdl_probe.cu
//   /tmp/pdl_probe
#include <cuda_runtime.h>

#include <cstdio>

#include "kernels/common/ptx.cuh"

__device__ unsigned long long now_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void primary(unsigned long long* t) {
  cake::kernels::launch_dependents();
  if (blockIdx.x != 0) return;
  unsigned long long const start = now_ns();
  while (now_ns() - start < 20000000ull) {
  }
  if (threadIdx.x == 0) t[0] = now_ns();  // the primary's end
}

__global__ void record(unsigned long long* t, int slot) {
  if (threadIdx.x == 0 && blockIdx.x == 0) t[slot] = now_ns();
}

static void check(cudaError_t e, char const* what) {
  if (e != cudaSuccess) {
    std::printf("%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

static void enqueue(cudaStream_t s, unsigned long long* t) {
  primary<<<264, 128, 0, s>>>(t);
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(1);
  config.blockDim = dim3(32);
  config.stream = s;
  cudaLaunchAttribute attr = {};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attr;
  config.numAttrs = 1;
  check(cudaLaunchKernelEx(&config, record, t, 1), "secondary launch");
  record<<<1, 32, 0, s>>>(t, 2);  // an ordinary launch after the secondary
}

static void report(char const* name, unsigned long long* t) {
  unsigned long long h[3];
  check(cudaMemcpy(h, t, sizeof h, cudaMemcpyDeviceToHost), "copy");
  long long const sec = static_cast<long long>(h[1]) - static_cast<long long>(h[0]);
  long long const ord = static_cast<long long>(h[2]) - static_cast<long long>(h[0]);
  std::printf("%-22s secondary starts %+9.3f ms after the primary's end (%s); the ordinary "
              "kernel after it %+9.3f ms (%s)\n",
              name, sec / 1e6, sec < 0 ? "OVERLAP" : "serialised", ord / 1e6,
              ord < 0 ? "did NOT wait for the primary" : "waited");
}

int main() {
  unsigned long long* t = nullptr;
  check(cudaMalloc(&t, 3 * sizeof(unsigned long long)), "malloc");
  cudaStream_t blocking, non_blocking;
  check(cudaStreamCreate(&blocking), "stream");
  check(cudaStreamCreateWithFlags(&non_blocking, cudaStreamNonBlocking), "stream");
  struct {
    char const* name;
    cudaStream_t s;
  } const kinds[] = {{"legacy default stream", nullptr},
                     {"per-thread default", cudaStreamPerThread},
                     {"created, blocking", blocking},
                     {"created, non-blocking", non_blocking}};
  for (int rep = 0; rep < 2; ++rep)
    for (auto const& k : kinds) {
      enqueue(k.s, t);
      check(cudaDeviceSynchronize(), k.name);
      report(k.name, t);
    }
  // captured into a graph and replayed
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  check(cudaStreamBeginCapture(non_blocking, cudaStreamCaptureModeGlobal), "capture");
  enqueue(non_blocking, t);
  check(cudaStreamEndCapture(non_blocking, &graph), "end capture");
  check(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  for (int rep = 0; rep < 2; ++rep) {
    check(cudaGraphLaunch(exec, non_blocking), "graph launch");
    check(cudaDeviceSynchronize(), "graph");
    report("graph replay", t);
  }
  return 0;
}
