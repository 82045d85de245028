// Narrow gradients read by the optimizer update itself. Invariant afterwards: no update that widens its gradients
// (MultiTensorUpdate::widens_gradients) reads, as a gradient, a view chain of a widening cast whose every reader
// leads (through views alone) to such updates' gradients: it reads the same views of the narrow value, and the cast
// is gone. Test: tests/compile/passes/test_passes.cpp (WidenInUpdate.*).
//
// Note [Narrow gradients read by the update]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// DDP with distributed.reduce_dtype bf16 (PyTorch's bf16 compress hook) reduces each bucket in bf16: the products
// write their gradients straight into the bf16 bucket (bucket_views), and after the all-reduce one cast widens the
// whole bucket to f32 for AdamW, which slices it per parameter. For the ~1B Llama that cast reads 2.5 GB and writes
// 4.9 GB per step, and AdamW reads the 4.9 GB again: the bf16 step ran no faster than the f32 one at 4 GPUs (80.82 vs
// 80.78 ms, bench/RESULTS.md, twenty-eighth session) although NCCL moved half the bytes. AdamW widens any float
// gradient to f32 as it loads it (its generated kernel and its eager kernels alike), so the update reads the bf16
// slices and the cast goes: the same f32 values reach the same arithmetic, bit for bit. The same holds for ZeRO-1/2's
// bf16 reduce-scatter (no views then). An update reads every gradient in one dtype (its kernel has one gradient
// type), so an update takes the narrow values for all its gradients or for none.
#pragma once

#include "compile/passes/pass.h"

namespace ingot::compiler::passes {

struct WidenInUpdateOptions {
  Device target = Device::cpu();
};

bool widen_in_update(Graph& g, const WidenInUpdateOptions& o);

}  // namespace ingot::compiler::passes
