// A data-parallel bucket seen whole, for the compiler's graph rewrites (compile/passes/bucket_views.cpp); models
// never build it directly.
#pragma once

#include <memory>

#include "autograd/primitive.h"

namespace ingot {

// inputs: 1-d pieces of one dtype; output: their concatenation. When the pieces already lie one after the other
// in one buffer that holds the whole result (the executor placed them there: Note [Values placed in buckets],
// compile/ir/graph.h) the result is a view of that buffer and nothing is copied; otherwise it is cat(pieces, 0).
// A View op (FusionKind::View): it launches nothing in a compiled step.
std::shared_ptr<Primitive> make_bucket_view();

}  // namespace ingot
