#include "compile/exec/kernel_step.h"

#include <algorithm>
#include <cmath>
#include <memory>

namespace ingot::compiler {
namespace {

struct OutMeta {
  int32_t value;
  Shape shape;
  DType dtype;
  Device device;
  bool placed = false;  // written into the slot the executor put in env (Note [Values placed in buckets])
};

std::vector<OutMeta> out_metas(const Graph& g, const std::vector<int32_t>& values) {
  std::vector<OutMeta> outs;
  for (int32_t v : values) {
    const Value& val = g.values[static_cast<size_t>(v)];
    outs.push_back(OutMeta{v, trace_shape(val.shape), val.dtype, val.device, val.placed_in >= 0});
  }
  return outs;
}

}  // namespace

GroupKernel make_kernel_step(const Graph& g, const LoweredGroup& lg, KernelCall kernel, DeviceScalarsCall device_call) {
  if (lg.spec.kind == codegen::KernelKind::MultiTensor && lg.hyper_value < 0) {
    // Note [Parameter casts]: inputs and outputs are one slot each, per tensor; outputs are fresh buffers.
    const std::vector<OutMeta> outs = out_metas(g, lg.outputs);
    const std::vector<int32_t> inputs = lg.inputs;
    return {[inputs, outs, kernel](std::vector<Tensor>& env) {
              std::vector<int64_t> syms{static_cast<int64_t>(inputs.size())};
              std::vector<void*> bufs;
              std::vector<Tensor> keep;
              for (size_t t = 0; t < inputs.size(); ++t) {
                Tensor in = env[static_cast<size_t>(inputs[t])];
                if (!in.is_contiguous()) in = in.contiguous_raw();
                Tensor out = empty(outs[t].shape, outs[t].dtype, outs[t].device);
                syms.push_back(in.numel());
                bufs.push_back(in.data_ptr());
                bufs.push_back(out.data_ptr());
                keep.push_back(in);
                env[static_cast<size_t>(outs[t].value)] = out;
              }
              const double no_scalars = 0;
              kernel(bufs.data(), syms.data(), &no_scalars);
            },
            nullptr};
  }
  if (lg.spec.kind == codegen::KernelKind::MultiTensor) {
    const size_t n = lg.tensors;
    int32_t node_index = g.values[static_cast<size_t>(lg.outputs[0])].producer;
    // inputs: hyper, then input_slots lists of n (AdamW: p, g, m, v, or p, g's pieces, m, v); outputs: a list per
    // state slot (AdamW: p', m', v'), each updating its input slot.
    const std::vector<size_t> state = lg.state_slots;
    const size_t slots = (lg.inputs.size() - 1) / n, outs_per = state.size();
    std::vector<bool> inplace(outs_per * n);
    for (size_t s = 0; s < outs_per; ++s)
      for (size_t t = 0; t < n; ++t)
        inplace[s * n + t] = in_place_ok(g, node_index, lg.inputs[1 + state[s] * n + t], lg.outputs[s * n + t]);
    const LoweredGroup meta = lg;  // ids and hyper-parameters only are read below
    constexpr size_t kScalars = 6;
    // The kernel's scalars from this call's hyper-parameter row: computed on the host either way, so a kernel
    // that reads them from device memory gets the same doubles as one passed them.
    auto compute = [meta](const std::vector<Tensor>& env, double* out) {
      const Tensor& hyper = env[static_cast<size_t>(meta.hyper_value)];
      const double* h = hyper.data<double>() + meta.hyper_row * 3;
      const double lr = h[0], step = h[1], scale = h[2];
      const double scalars[kScalars] = {lr, 1.0 - lr * meta.weight_decay, scale, 1.0 - std::pow(meta.beta1, step),
                                        1.0 - std::pow(meta.beta2, step), step};
      std::copy(scalars, scalars + kScalars, out);
    };
    // Gathers the buffers and calls `launch` with them (in place where the graph allows, else into copies).
    auto run = [meta, inplace, n, slots, state](std::vector<Tensor>& env,
                                                const std::function<void(void* const*, const int64_t*)>& launch) {
      std::vector<int64_t> syms{static_cast<int64_t>(n)};
      std::vector<void*> bufs;
      std::vector<Tensor> outs(state.size() * n);
      std::vector<Tensor> in(slots);
      for (size_t t = 0; t < n; ++t) {
        for (size_t s = 0; s < slots; ++s) {
          in[s] = env[static_cast<size_t>(meta.inputs[1 + s * n + t])];
          if (!in[s].is_contiguous()) in[s] = in[s].contiguous_raw();
        }
        syms.push_back(in[0].numel());
        for (size_t s = 0; s < state.size(); ++s) {
          const Tensor& src = in[state[s]];
          outs[s * n + t] = inplace[s * n + t] ? src : src.clone_raw();
        }
        for (size_t s = 0; s < slots; ++s) bufs.push_back(in[s].data_ptr());
        for (size_t s = 0; s < state.size(); ++s) bufs.push_back(outs[s * n + t].data_ptr());
      }
      launch(bufs.data(), syms.data());
      for (size_t k = 0; k < outs.size(); ++k) env[static_cast<size_t>(meta.outputs[k])] = outs[k];
    };
    GroupKernel step;
    step.run = [compute, run, kernel](std::vector<Tensor>& env) {
      double scalars[kScalars];
      compute(env, scalars);
      run(env, [&](void* const* bufs, const int64_t* syms) { kernel(bufs, syms, scalars); });
    };
    if (device_call) {
      auto hs = std::make_shared<HostScalars>();
      hs->count = kScalars;
      hs->compute = compute;
      hs->run = [run, device_call](std::vector<Tensor>& env, const double* device_scalars) {
        run(env, [&](void* const* bufs, const int64_t* syms) { device_call(bufs, syms, device_scalars); });
      };
      step.host_scalars = std::move(hs);
    }
    return step;
  }
  const std::vector<OutMeta> outs = out_metas(g, lg.outputs);
  const std::vector<int32_t> inputs = lg.inputs;
  return {[inputs, outs, kernel](std::vector<Tensor>& env) {
    std::vector<void*> bufs;
    std::vector<Tensor> keep;
    keep.reserve(inputs.size());
    for (int32_t v : inputs) {
      Tensor t = env[static_cast<size_t>(v)];
      if (!t.is_contiguous()) t = t.contiguous_raw();
      keep.push_back(t);
      bufs.push_back(t.data_ptr());
    }
    for (const OutMeta& o : outs) {
      const Tensor& slot = env[static_cast<size_t>(o.value)];
      Tensor t = o.placed && slot.defined() ? slot : empty(o.shape, o.dtype, o.device);
      bufs.push_back(t.data_ptr());
      env[static_cast<size_t>(o.value)] = t;
    }
    const int64_t no_syms = 0;
    const double no_scalars = 0;
    kernel(bufs.data(), &no_syms, &no_scalars);
  }, nullptr};
}

}  // namespace ingot::compiler
