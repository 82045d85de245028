# Build pieces of compile/cache and compile/codegen/cpu, included by compile/CMakeLists.txt after the
# ingot_compile target exists (kept here so the compiler core's CMakeLists stays about the core).
#  - C++ for the cache's Protobuf messages, generated into the build tree;
#  - the ingot version that cache entries are stamped with;
#  - dlopen/dlsym for loading compiled kernel libraries.
# protoc names outputs relative to compile/ (cache/cache_entry.pb.h), so they go under generated/compile/ and
# code includes "compile/cache/cache_entry.pb.h"; the generated .cc includes its header the short way.
protobuf_generate(TARGET ingot_compile
  PROTOS ${CMAKE_CURRENT_LIST_DIR}/cache_entry.proto
  PROTOC_OUT_DIR ${CMAKE_BINARY_DIR}/generated/compile)
target_include_directories(ingot_compile PUBLIC ${CMAKE_BINARY_DIR}/generated
  PRIVATE ${CMAKE_BINARY_DIR}/generated/compile)
target_link_libraries(ingot_compile PUBLIC protobuf::libprotobuf PRIVATE ${CMAKE_DL_LIBS})
set_property(SOURCE ${CMAKE_CURRENT_LIST_DIR}/compile_cache.cpp APPEND PROPERTY
  COMPILE_DEFINITIONS INGOT_VERSION="${PROJECT_VERSION}")
