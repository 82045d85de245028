# Build pieces of compile/codegen/cuda, included by compile/CMakeLists.txt (INGOT_CUDA only) after the
# ingot_compile target exists: NVRTC compiles the generated kernels, the driver API loads and launches
# them, the runtime API gives device properties and ingot's streams. INGOT_WITH_CUDA_CODEGEN tells code
# outside (the compiler core, tests) that codegen::cuda::CudaCodegen exists.
target_link_libraries(ingot_compile PRIVATE CUDA::nvrtc CUDA::cuda_driver CUDA::cudart)
target_compile_definitions(ingot_compile PUBLIC INGOT_WITH_CUDA_CODEGEN=1)
