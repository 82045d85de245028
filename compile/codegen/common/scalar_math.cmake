# Note [Scalar math written once] (runtime/kernels/scalar_math.h): generated kernels include that header by
# name, so its text is compiled into ingot_compile (scalar_math_source()); CMake re-reads it when it changes.
set(_ingot_scalar_math ${PROJECT_SOURCE_DIR}/runtime/kernels/scalar_math.h)
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${_ingot_scalar_math})
file(READ ${_ingot_scalar_math} INGOT_SCALAR_MATH_TEXT)
configure_file(${CMAKE_CURRENT_SOURCE_DIR}/codegen/common/scalar_math_text.cpp.in
               ${CMAKE_CURRENT_BINARY_DIR}/generated/scalar_math_text.cpp @ONLY)
target_sources(ingot_compile PRIVATE ${CMAKE_CURRENT_BINARY_DIR}/generated/scalar_math_text.cpp)
