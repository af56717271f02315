# The sm_90a GPU path (included by CMakeLists.txt when CAKE_CUDA=ON): the kernels under
# src/kernels, the host code that sequences them (src/ops/cuda), and the GPU check program.
enable_language(CUDA)
find_package(CUDAToolkit REQUIRED)

# CMake 3.25 knows no CUDA20 dialect for nvcc; the kernels need only C++17. cake_lib exists
# already, so the dialect is set on it rather than through CMAKE_CUDA_STANDARD.
set_target_properties(cake_lib PROPERTIES CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON
                                          CUDA_EXTENSIONS OFF)
# Hopper only: the kernels use wgmma and setmaxnreg, which need sm_90a; no other target is built.
set_target_properties(cake_lib PROPERTIES CUDA_ARCHITECTURES OFF)

file(GLOB CAKE_CUDA_OPS_SOURCES CONFIGURE_DEPENDS src/ops/cuda/*.cpp)
file(GLOB_RECURSE CAKE_KERNEL_SOURCES CONFIGURE_DEPENDS src/kernels/*.cu)
target_sources(cake_lib PRIVATE ${CAKE_CUDA_OPS_SOURCES} ${CAKE_KERNEL_SOURCES})
target_compile_options(cake_lib PRIVATE
  $<$<COMPILE_LANGUAGE:CUDA>:-gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr
                             -lineinfo -Xptxas=-warn-spills>)
# The static runtime: the Python module then loads wherever torch runs, with no libcudart search.
target_link_libraries(cake_lib PUBLIC CUDA::cudart_static)

# GPU check: random problems through the seam against the FP64 reference, plus timings.
# Its .cu files are self-tests of device building blocks (src/kernels/common), built for sm_90a.
file(GLOB CAKE_CUDA_CHECK_SOURCES CONFIGURE_DEPENDS tests/cuda/*.cpp tests/cuda/*.cu)
if(CAKE_CUDA_CHECK_SOURCES)
  add_executable(cake_cuda_check ${CAKE_CUDA_CHECK_SOURCES})
  target_link_libraries(cake_cuda_check PRIVATE cake_lib)
  target_include_directories(cake_cuda_check PRIVATE tests)
  set_target_properties(cake_cuda_check PROPERTIES CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON
                                                   CUDA_ARCHITECTURES OFF)
  target_compile_options(cake_cuda_check PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:-gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr>)
endif()
