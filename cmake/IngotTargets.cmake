# Helpers that give every module the same flags and layout.
#   ingot_module(NAME <name> SOURCES ... [PUBLIC_DEPS ...] [PRIVATE_DEPS ...])
# creates library ingot_<name> with alias ingot::<name>; includes are rooted at the source tree so code
# writes #include "runtime/tensor.h".
function(ingot_set_warnings target)
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-sign-compare>)
  if(INGOT_WERROR)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
  endif()
endfunction()

function(ingot_module)
  cmake_parse_arguments(M "" "NAME" "SOURCES;PUBLIC_DEPS;PRIVATE_DEPS" ${ARGN})
  add_library(ingot_${M_NAME} STATIC ${M_SOURCES})
  add_library(ingot::${M_NAME} ALIAS ingot_${M_NAME})
  target_include_directories(ingot_${M_NAME} PUBLIC ${PROJECT_SOURCE_DIR})
  target_link_libraries(ingot_${M_NAME} PUBLIC ${M_PUBLIC_DEPS} PRIVATE ${M_PRIVATE_DEPS})
  ingot_set_warnings(ingot_${M_NAME})
endfunction()
