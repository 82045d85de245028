// Traceable optimizer updates. Eagerly, AdamW/SGD step() call the fused multi-tensor kernels in place. Under
// a trace (autograd TraceObserver, see compile/trace/trace.cpp) they instead apply one of these primitives per
// launch (apply_traced_update): a functional version of the same kernel (parameters and state in, their updated
// values out) that the tracer records as one graph node, followed by write-backs into the persistent tensors. The
// hyper-parameters that change between steps (lr, step count, grad scale, SGD's first-step flag) are read
// from a host tensor `hyper` (f64, CPU, one row per launch) that the tracer re-computes before every replay,
// so an LR schedule never changes the graph. AdamW's primitive is also a MultiTensorUpdate: the compiler splits
// and lowers it through that interface (Note [Multi-tensor updates], autograd/primitive_multi_tensor.h).
#pragma once

#include <memory>
#include <source_location>
#include <vector>

#include "autograd/primitive.h"
#include "autograd/primitive_multi_tensor.h"  // InPlaceUpdate
#include "runtime/kernels/kernels.h"

namespace ingot::optim {

// inputs:  hyper [G, 3] = {lr, step, grad_scale} per launch, p[0..n), g[0..n), m[0..n), v[0..n)
// outputs: p'[0..n), m'[0..n), v'[0..n)          row: which row of hyper this launch reads
std::shared_ptr<Primitive> make_adamw_update(size_t n, int64_t row, const kernels::AdamWArgs& fixed);
// inputs:  hyper [G, 3] = {lr, grad_scale, first_step} per launch, p[0..n), g[0..n), buf[0..n) (undefined
//          without momentum)      outputs: p'[0..n), buf'[0..n) (buf' only with momentum)
std::shared_ptr<Primitive> make_sgd_update(size_t n, int64_t row, const kernels::SgdArgs& fixed);
// Row `row` of a hyper-parameter tensor (three doubles), after checking it is a contiguous f64 CPU [G, 3] tensor
// with that row; errors name `op`.
const double* hyper_row(const Tensor& hyper, int64_t row, const char* op);
// in[from, from + n): fresh copies to update (an update's functional eval), or the tensors themselves (in place);
// undefined ones (SGD without momentum) stay undefined.
std::vector<Tensor> update_operands(const std::vector<Tensor>& in, size_t from, size_t n, bool in_place);
// `fixed` with the learning rate, step and gradient scale of a hyper-parameter row {lr, step, grad_scale}.
kernels::AdamWArgs adamw_args(const kernels::AdamWArgs& fixed, const double* hyper);

// Note [Traced updates run in place]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The traced step runs for real, and the functional update makes its outputs before the write-backs copy them
// over the parameters and state: for a moment the step holds every updated tensor twice. An 8B full fine-tune
// under ZeRO-3 on 2 GPUs holds 48 GB of f32 master shards and AdamW moments per rank, so its traced first step
// peaked at 112 GB against 75 GB for every later step (bench/RESULTS.md, seventeenth session). So the update runs
// over its inputs (the kernel eager step() calls, same arithmetic) and the tracer records the same node and
// write-backs as for the functional form (TraceObserver::on_apply_over). Deferred segments (compile/trace/
// segments.h) cannot: their inputs are computed at the segment's end; there the functional form remains.
//
// Every optimizer's update (AdamW, SGD, Lion, AdamW8bit) is an InPlaceUpdate (autograd/primitive_multi_tensor.h).

// Applies `update` (a Primitive that is an InPlaceUpdate) to `in` under a trace, its outputs written over the
// parameters and state they update.
void apply_traced_update(const std::shared_ptr<Primitive>& update, const std::vector<Tensor>& in,
                         std::source_location loc = std::source_location::current());

}  // namespace ingot::optim
