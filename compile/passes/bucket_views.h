// Gradients made in their data-parallel bucket. Invariant afterwards: no cat node concatenates a DDP bucket (a cat
// along dim 0 whose 1-d result an all-reduce start reads, directly or through one cast) whose every piece is made
// by a node that can write into a given buffer (an op with writes_given_outputs, or with generated kernels a
// pointwise or reduction node), possibly through reshapes and through the input an accumulating op adds into
// (reusable_input, read nowhere else), none of them a root: each such cat is a bucket_view node (autograd/ops/bucket_view.h), and every value of those chains is
// placed in the bucket's value at its piece's offset (Note [Values placed in buckets], compile/ir/graph.h), so the
// executor makes the bucket's buffer once, each producer writes its piece there, and the concatenation copies
// nothing. Other readers of a placed gradient (clipping's norms) read its slice.
// Test: tests/distributed/test_ddp_graph.cpp (DdpGraph.GradientsAreMadeInTheirBucketsSoNothingConcatenatesThem)
// and tests/compile/passes/test_bucket_views.cpp (BucketViews.*).
#pragma once

#include "compile/passes/pass.h"

namespace ingot::compiler::passes {

struct BucketViewOptions {
  Device target = Device::cpu();
  bool generated = true;  // fusion groups become generated kernels (which write where the executor says)
  // ZeRO's unit reduce-scatter inputs too (the unit's gradients concatenated, then cast to reduce_dtype). The
  // bucket, made at its first gradient, lives through more of the backward (compiled ZeRO-3 GPT-2's planned peak rose
  // 2%), against the unit's concatenation and cast copies it saves (8B, bf16 gradients reduced in f32: ~2 GB read and
  // written per unit and step): the 8B ZeRO-3 step ran 2.0% faster on 2x H200 and the ~1B Llama's 1.8% on 2x H100
  // with the same losses and steady peak (bench/RESULTS.md, fifteenth and seventeenth sessions).
  bool reduce_scatters = true;
};

bool bucket_views(Graph& g, const BucketViewOptions& o);

}  // namespace ingot::compiler::passes
