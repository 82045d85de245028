# Build pieces of compile/codegen/cuda, included by compile/CMakeLists.txt (INGOT_CUDA only) after the
# ingot_compile target exists: NVRTC compiles the generated kernels, the runtime API gives device properties
# and ingot's streams. The driver API that loads and launches the cubins is resolved at run time through the
# runtime (driver_api.cpp), never linked: libcuda.so.1 comes with the driver and is absent on CPU-only machines.
# INGOT_WITH_CUDA_CODEGEN tells code outside (the compiler core, tests) that codegen::cuda::CudaCodegen exists.
target_link_libraries(ingot_compile PRIVATE CUDA::nvrtc CUDA::cudart)
target_compile_definitions(ingot_compile PUBLIC INGOT_WITH_CUDA_CODEGEN=1)
