#include "compile/exec/graph_replay.h"

#include <cstdlib>

#include "compile/logs.h"
#include "runtime/allocator.h"
#include "runtime/error.h"

namespace ingot::compiler {
namespace {

// Makes `s` the device's current stream for the scope (allocations and launches of eager code go to it).
using cuda::StreamScope;

// `to` waits for the work queued on `from` so far.
void join(cuda::Stream from, cuda::Stream to) {
  cuda::Event e;
  e.record(from);
  e.wait(to);
}

}  // namespace

std::string GraphReplay::unsupported_reason(const Executable& exe) {
  const Graph& g = exe.graph;
  std::optional<Device> dev;
  if (!g.just_in_time.empty() || !g.before_backward.empty() || !g.at_end.empty())
    return "the step binds inputs just in time or runs host work between its steps (offloaded optimizer state)";
  for (const GraphInput& in : g.inputs) {
    if (in.role == InputRole::Host) continue;
    const Device d = g.values[static_cast<size_t>(in.value)].device;
    if (!d.is_cuda()) return "input '" + in.name + "' is on " + d.str() + " (CUDA graphs need every tensor on one GPU)";
    if (dev && !(*dev == d)) return "inputs on " + dev->str() + " and " + d.str();
    dev = d;
    if (in.grad_of) return "the step reads '" + in.name + "' (a .grad kept across calls); call zero_grad()";
  }
  if (!dev) return "no GPU input";
  for (const GradOut& go : g.grad_outs)
    if (go.value >= 0) return "the step leaves .grad values behind (call zero_grad() in the step)";
  if (!g.symbols.empty())
    return "dynamic dim " + g.symbols.front().name + " (CUDA graphs are captured per static shape)";
  return {};
}

GraphReplay::GraphReplay(std::shared_ptr<const Executable> exe) : exe_(std::move(exe)) {
  const Graph& g = exe_->graph;
  for (const GraphInput& in : g.inputs)
    if (in.role != InputRole::Host) device_ = g.values[static_cast<size_t>(in.value)].device;
  std::vector<bool> host_value(g.values.size(), false);
  for (const GraphInput& in : g.inputs)
    if (in.role == InputRole::Host) host_value[static_cast<size_t>(in.value)] = true;
  keep_.assign(g.values.size(), false);
  for (const GraphInput& in : g.inputs) keep_[static_cast<size_t>(in.value)] = true;
  for (int32_t o : g.outputs) keep_[static_cast<size_t>(o)] = true;
  for (const WriteBack& w : g.writebacks) keep_[static_cast<size_t>(w.value)] = true;
  host_step_.assign(exe_->steps.size(), false);
  scalar_offset_.assign(exe_->steps.size(), kNoScalars);
  step_outputs_.resize(exe_->steps.size());
  // Steps that read host inputs only through their scalars read them from the device instead (Note [Scalars read
  // from the device]). INGOT_GRAPH_HOST_SCALARS=1 runs such steps between the graphs as before: an A/B switch for
  // measurements (with per-bucket updates on several GPUs the capture then fails and the step runs without graphs;
  // compare with --one-update).
  const bool scalars_on_host = std::getenv("INGOT_GRAPH_HOST_SCALARS") != nullptr;
  for (size_t i = 0; i < exe_->steps.size(); ++i) {
    const auto [b, e] = step_node_range(*exe_, i);
    bool host = false;
    const bool device_scalars = exe_->steps[i].host_scalars != nullptr && !scalars_on_host;
    for (size_t n = b; n < e; ++n) {
      for (int32_t v : g.nodes[n].inputs) {
        if (v < 0 || (device_scalars && host_value[static_cast<size_t>(v)])) continue;
        if (host_value[static_cast<size_t>(v)] || !g.values[static_cast<size_t>(v)].device.is_cuda()) host = true;
      }
      for (int32_t v : g.nodes[n].outputs) {
        if (!g.values[static_cast<size_t>(v)].device.is_cuda()) host = true;
        step_outputs_[i].push_back(v);
      }
    }
    host_step_[i] = host;
    if (!host && device_scalars) {
      scalar_offset_[i] = scalar_count_;
      scalar_count_ += exe_->steps[i].host_scalars->count;
    }
    if (!host) continue;
    for (size_t n = b; n < e; ++n) {
      for (int32_t v : g.nodes[n].inputs)
        if (v >= 0) keep_[static_cast<size_t>(v)] = true;
      for (int32_t v : g.nodes[n].outputs) keep_[static_cast<size_t>(v)] = true;
    }
  }
}

GraphReplay::~GraphReplay() {
  drop_capture();
  if (stream_.handle) {
    cuda::synchronize_stream(stream_);
    cuda::destroy_stream(stream_);
  }
  for (ScalarStaging& st : staging_)
    if (st.host) cuda::host_free_pinned(st.host);
}

void GraphReplay::upload_scalars(const std::vector<Tensor>& env) {
  if (scalar_count_ == 0) return;
  ScalarStaging& st = staging_[next_staging_];
  next_staging_ = (next_staging_ + 1) % staging_.size();
  if (!st.host) {
    st.host = static_cast<double*>(cuda::host_alloc_pinned(scalar_count_ * sizeof(double)));
    const int previous = cuda::current_device();
    cuda::set_device(device_.index);  // events belong to the device whose stream records them
    st.copied = std::make_unique<cuda::Event>();
    cuda::set_device(previous);
  }
  st.copied->synchronize();  // its copy of staging_.size() calls ago has run: the buffer is free
  for (size_t i = 0; i < exe_->steps.size(); ++i)
    if (scalar_offset_[i] != kNoScalars) exe_->steps[i].host_scalars->compute(env, st.host + scalar_offset_[i]);
  cuda::copy_to_device_async(scalars_dev_.data_ptr(), st.host, scalar_count_ * sizeof(double), stream_);
  st.copied->record(stream_);
}

void GraphReplay::capture_step(size_t k, std::vector<Tensor>& env) {
  const ExecStep& s = exe_->steps[k];
  if (scalar_offset_[k] == kNoScalars) return run_step(exe_->graph, s, env);
  INGOT_CHECK(s.placed.empty(), "reduce-overhead: a step reading device scalars places values in buckets");
  s.host_scalars->run(env, static_cast<const double*>(scalars_dev_.data_ptr()) + scalar_offset_[k]);
}

void GraphReplay::drop_capture() {
  if (stream_.handle && !segments_.empty()) cuda::synchronize_stream(stream_);  // graphs in flight use env_
  for (Segment& s : segments_) cuda::destroy_graph(s.exec);
  segments_.clear();
  env_.clear();
  scalars_dev_ = Tensor();
  statics_.clear();
  captured_.clear();
  captured_ptrs_.clear();
  if (pool_held_) allocator_for(device_).release_pool(stream_);
  pool_held_ = false;
}

size_t GraphReplay::graphs() const {
  size_t n = 0;
  for (const Segment& s : segments_) n += s.exec != nullptr;
  return n;
}
size_t GraphReplay::host_steps() const { return segments_.size() - graphs(); }

std::vector<Tensor> GraphReplay::run(const std::vector<Tensor>& args) {
  if (!disabled_.empty()) return execute(*exe_, args);
  // The first call warms up outside any graph (library handles, plans and workspaces get made).
  if (calls_++ == 0) return execute(*exe_, args);
  if (!segments_.empty() && still_valid(args)) return replay(args);
  drop_capture();
  return capture(args);
}

bool GraphReplay::still_valid(const std::vector<Tensor>& args) const {
  if (args.size() != statics_.size()) return false;
  for (size_t i = 0; i < args.size(); ++i)
    if (args[i].shape() != statics_[i].shape() || args[i].dtype() != statics_[i].dtype()) return false;
  size_t k = 0;
  for (const GraphInput& in : exe_->graph.inputs)
    if (in.role == InputRole::Captured && in.tensor.data_ptr() != captured_ptrs_[k++]) return false;
  return true;
}

std::vector<Tensor> GraphReplay::capture(const std::vector<Tensor>& args) {
  const Graph& g = exe_->graph;
  if (!stream_.handle) stream_ = cuda::create_stream(device_.index);
  if (!pool_held_) allocator_for(device_).hold_pool(stream_);
  pool_held_ = true;
  const cuda::Stream caller = cuda::current_stream(device_.index);
  for (const Tensor& a : args) statics_.push_back(a.clone_raw());  // on the caller's stream and pool
  std::vector<Tensor> env;
  {
    join(caller, stream_);
    StreamScope scope(stream_);
    env = bind_inputs(g, statics_, &captured_);
    if (scalar_count_ > 0) {
      // Allocated before any capture, on the private stream; it lives, at this address, as long as the graphs.
      scalars_dev_ = empty(Shape{static_cast<int64_t>(scalar_count_)}, DType::f64, device_);
      upload_scalars(env);
    }
    std::string failure;
    auto release = [&](size_t b, size_t e) {
      for (size_t k = b; k < e; ++k)
        for (int32_t v : exe_->steps[k].release)
          if (!keep_[static_cast<size_t>(v)]) env[static_cast<size_t>(v)] = Tensor();
    };
    const size_t n = exe_->steps.size();
    for (size_t i = 0; i < n;) {
      if (host_step_[i]) {
        run_step(g, exe_->steps[i], env);
        segments_.push_back(Segment{nullptr, i, i + 1});
        release(i, i + 1);
        ++i;
        continue;
      }
      size_t j = i;
      while (j < n && !host_step_[j]) ++j;
      if (failure.empty()) {
        // What is live on entry, so that a failed capture can re-run these steps from their inputs. Releases
        // inside the capture still happen, so its intermediates reuse memory as in a normal run.
        const std::vector<Tensor> live_in = env;
        try {
          cuda::begin_capture(stream_);
          for (size_t k = i; k < j; ++k) {
            capture_step(k, env);
            release(k, k + 1);
          }
          void* exec = cuda::end_capture(stream_);
          segments_.push_back(Segment{exec, i, j});
          cuda::launch_graph(exec, stream_);
        } catch (const std::exception& e) {
          cuda::abort_capture(stream_);
          failure = e.what();
          env = live_in;
        }
        if (failure.empty()) {
          i = j;
          continue;
        }
      }
      for (size_t k = i; k < j; ++k) {
        run_step(g, exe_->steps[k], env);
        release(k, k + 1);
      }
      i = j;
    }
    if (!failure.empty()) {
      disabled_ = "capture failed: " + failure;
      log(LogKind::Recompiles, "warning: reduce-overhead: CUDA graph " + disabled_ + "; the step runs without graphs");
    }
    join(stream_, caller);
  }
  for (const GraphInput& in : g.inputs)
    if (in.role == InputRole::Captured) captured_ptrs_.push_back(in.tensor.data_ptr());
  std::vector<Tensor> outs = results(env);
  if (disabled_.empty()) {
    env_ = std::move(env);
  } else {
    drop_capture();
  }
  return outs;
}

std::vector<Tensor> GraphReplay::replay(const std::vector<Tensor>& args) {
  const Graph& g = exe_->graph;
  const cuda::Stream caller = cuda::current_stream(device_.index);
  for (size_t i = 0; i < args.size(); ++i)
    if (args[i].data_ptr() != statics_[i].data_ptr()) statics_[i].copy_(args[i]);
  join(caller, stream_);
  {
    StreamScope scope(stream_);
    for (const GraphInput& in : g.inputs)
      if (in.role == InputRole::Host) env_[static_cast<size_t>(in.value)] = in.produce().detach();
    upload_scalars(env_);
    for (const Segment& s : segments_) {
      if (s.exec) {
        cuda::launch_graph(s.exec, stream_);
        continue;
      }
      std::vector<Tensor> before;
      for (int32_t v : step_outputs_[s.begin]) before.push_back(env_[static_cast<size_t>(v)]);
      run_step(g, exe_->steps[s.begin], env_);
      for (size_t k = 0; k < before.size(); ++k) {
        Tensor& now = env_[static_cast<size_t>(step_outputs_[s.begin][k])];
        if (before[k].defined() && now.data_ptr() != before[k].data_ptr()) {
          before[k].copy_(now);
          now = before[k];
        }
      }
    }
    join(stream_, caller);
  }
  return results(env_);
}

std::vector<Tensor> GraphReplay::results(const std::vector<Tensor>& env) {
  // On the caller's stream: clones come from its pool, so a result the caller keeps is never memory that the
  // next replay writes (Note [Why a private stream is a private pool]).
  std::vector<Tensor> outs = finish(exe_->graph, env, captured_);
  for (size_t k = 0; k < outs.size(); ++k) {
    const Tensor& v = env[static_cast<size_t>(exe_->graph.outputs[k])];
    if (outs[k].defined() && v.defined() && outs[k].storage() == v.storage()) outs[k] = outs[k].clone_raw();
  }
  return outs;
}

}  // namespace ingot::compiler
