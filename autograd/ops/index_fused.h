// index_add accumulating into an existing tensor, for the compiler's graph rewrites
// (compile/passes/accumulate_index_add.cpp); models never build it directly.
#pragma once

#include <memory>

#include "autograd/primitive.h"

namespace ingot {

// For an index_add primitive (inputs index, src; output zeros(shape) with src's rows added at the index along
// dim): the primitive with inputs (base, index, src) and output base + that, computed over base's buffer when
// nothing else holds it. nullptr when `index_add` is not one.
std::shared_ptr<Primitive> index_add_accumulate_from(const Primitive& index_add);

}  // namespace ingot
