#include "optim/optimizer.h"

#include <algorithm>
#include <charconv>
#include <deque>
#include <optional>

#include "autograd/primitive.h"
#include "runtime/cuda_runtime.h"
#include "runtime/kernels/kernels.h"
#include "runtime/kernels/quant8.h"

namespace ingot::optim {

kernels::AdamWArgs adamw_args(const AdamWOptions& o) {
  kernels::AdamWArgs a;
  a.beta1 = o.beta1;
  a.beta2 = o.beta2;
  a.eps = o.eps;
  a.weight_decay = o.weight_decay;
  return a;
}

Optimizer::Optimizer(std::vector<Tensor> params, double lr) : params_(std::move(params)), lr_(lr) {
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    INGOT_CHECK(p.defined() && p.is_leaf() && p.requires_grad(), "Optimizer: parameter ", i,
                " must be a leaf tensor with requires_grad");
    INGOT_CHECK(p.is_contiguous(), "Optimizer: parameter ", i, " ('", p.name(), "') must be contiguous");
    INGOT_CHECK(p.device() == params_[0].device(), "Optimizer: parameter ", i, " is on ", p.device().str(),
                " but parameter 0 is on ", params_[0].device().str());
    for (size_t j = 0; j < i; ++j)
      INGOT_CHECK(!p.same(params_[j]), "Optimizer: parameter ", i, " is the same tensor as parameter ", j);
  }
  state_.resize(params_.size());
  host_state_.resize(params_.size());
}

Optimizer::~Optimizer() = default;

void Optimizer::zero_grad() {
  for (Tensor& p : params_) p.zero_grad();
}

std::vector<size_t> Optimizer::params_with_grad() const {
  std::vector<size_t> idx;
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor g = params_[i].grad();
    if (!g.defined()) continue;
    INGOT_CHECK(g.is_contiguous(), "Optimizer: the grad of parameter ", i, " ('", params_[i].name(),
                "') must be contiguous");
    idx.push_back(i);
  }
  return idx;
}

// Note [Optimizer state offloaded]
// An 8B full fine-tune on one GPU keeps 16 GB of bf16 weights and ~16 GB of AdamW8bit moments there (35.7 GB at its
// peak with each parameter updated in its backward): over a 24 GB card. Offloaded (train.optimizer_offload), the
// moments live in page-locked host memory and pass through the GPU one parameter at a time, in the hook that updates
// that parameter in the backward (recipes/train_step.cpp): copied in, updated by the same kernel, copied back. The
// GPU then holds the weights, the activations and at most one parameter's gradient and state beyond them, at the
// price of moving the state over PCIe twice a step (what torchtune's paged 8-bit AdamW with optimizer_in_bwd does
// through unified memory). The copy in of the parameter updated next in the last step starts on a stream of its own
// right after an update (prefetch_after), beside the backward that makes that parameter's gradient; the copy back
// runs on another stream once the update is done, and the step's end waits for the last ones (finish_offload). A
// parameter that comes out of that order is copied in on the compute stream before its update (so is the first). A
// step's arithmetic is unchanged. Checkpoints save the host buffers as any state; a resumed run loads into host
// buffers directly, so the GPU never holds all of it. 8B full fine-tune on an H200 (bench/RESULTS.md, thirty-sixth
// session): 21.5 GB at 0.64 s a step (0.79-0.81 s without the prefetch, 1.10 s with synchronous copies both ways;
// 0.51 s eagerly with the state on the GPU).
namespace {
Tensor pinned_host_buffer(const Shape& shape, DType dtype) {
  const size_t bytes = static_cast<size_t>(numel(shape)) * itemsize(dtype);
  void* p = cuda::host_alloc_pinned(bytes);
  return from_blob(std::shared_ptr<void>(p, [](void* q) { cuda::host_free_pinned(q); }), p, shape, dtype,
                   Device::cpu());
}
}  // namespace

void Optimizer::place_state(size_t index, const std::string& name, const Tensor& t) {
  if (!state_on_host(index)) {
    state_[index][name] = t.to(params_[index].device());
    return;
  }
  Tensor host = pinned_host_buffer(t.shape(), t.dtype());
  host.copy_(t);
  state_[index][name] = host;
  host_state_[index][name] = host;
}

// The copies back to the host, on a stream of their own so that they run beside the backward: each holds its device
// buffer until its event says it is done. At most cap() bytes wait (the oldest are waited for beyond it: an eighth
// of the state offloaded, at most 1 GiB), so the GPU holds at most that much state beyond one parameter's however
// far the host runs ahead of the copies.
struct OffloadCopies {
  struct Pending {
    std::vector<Tensor> device_buffers;
    std::unique_ptr<cuda::Event> done;
    int64_t bytes = 0;
  };
  // The next parameter's state copied in ahead, on a stream of its own (Note [Optimizer state offloaded]).
  struct Prefetch {
    size_t index = 0;
    std::map<std::string, Tensor> device_buffers;
    std::unique_ptr<cuda::Event> done;
  };
  cuda::Stream stream, in_stream;
  std::deque<Pending> pending;
  int64_t bytes = 0;  // waiting
  static int64_t cap(const std::vector<std::map<std::string, Tensor>>& host_state) {
    int64_t offloaded = 0;
    for (const auto& named : host_state)
      for (const auto& [name, host] : named) offloaded += static_cast<int64_t>(host.nbytes());
    return std::min<int64_t>(int64_t{1} << 30, offloaded / 8);
  }
  std::vector<size_t> order, this_step;  // the parameters in the order of their updates: last step's, this one's
  std::optional<Prefetch> prefetch;
  explicit OffloadCopies(int device) : stream(cuda::create_stream(device)), in_stream(cuda::create_stream(device)) {}
  ~OffloadCopies() {
    drop_prefetch();
    wait_until(0);
    cuda::destroy_stream(stream);
    cuda::destroy_stream(in_stream);
  }
  // A prefetch nobody takes: its buffers are freed only once its copy is done.
  void drop_prefetch() {
    if (prefetch) prefetch->done->synchronize();
    prefetch.reset();
  }
  void wait_until(int64_t cap) {
    while (!pending.empty() && bytes > cap) {
      pending.front().done->synchronize();
      bytes -= pending.front().bytes;
      pending.pop_front();
    }
  }
};

// The host buffers to the GPU: the prefetched copy when there is one (the current stream waits for it), else on the
// current stream, asynchronously, before the update that follows there. Nothing writes a host buffer before its copy
// in is done (its copy back follows the update).
void Optimizer::restore_state(size_t index) {
  if (copies_ && copies_->prefetch) {
    if (copies_->prefetch->index == index) {
      const int device = params_[index].device().index;
      copies_->prefetch->done->wait(cuda::current_stream(device));
      for (auto& [name, dev] : copies_->prefetch->device_buffers) state_[index][name] = dev;
      copies_->prefetch.reset();
      return;
    }
    copies_->drop_prefetch();  // the order changed: this one is copied in below
  }
  for (const auto& [name, host] : host_state_[index]) {
    Tensor dev = empty(host.shape(), host.dtype(), params_[index].device());
    cuda::copy_to_device_async(dev.data_ptr(), host.data_ptr(), host.nbytes(), cuda::current_stream(dev.device().index));
    state_[index][name] = dev;
  }
}

namespace {
void prefetch_after(OffloadCopies& c, const std::vector<std::map<std::string, Tensor>>& host_state,
                    const std::vector<Tensor>& params, size_t index);
}  // namespace

// The updated state back to its host buffers on the copy stream, once the update is done (an event of the current
// stream), while the backward goes on.
void Optimizer::offload_state(size_t index) {
  if (!state_on_host(index)) return;
  const int device = params_[index].device().index;
  if (!copies_) copies_ = std::make_shared<OffloadCopies>(device);
  cuda::Event updated;
  updated.record(cuda::current_stream(device));
  updated.wait(copies_->stream);
  OffloadCopies::Pending p;
  for (auto& [name, t] : state_[index]) {
    if (!t.device().is_cuda()) continue;
    INGOT_INTERNAL_CHECK(t.is_contiguous(), "Optimizer::offload_state: state '", name, "' is not contiguous");
    Tensor& host = host_state_[index][name];
    if (!host.defined() || host.shape() != t.shape() || host.dtype() != t.dtype())
      host = pinned_host_buffer(t.shape(), t.dtype());
    cuda::copy_to_host_async(host.data_ptr(), t.data_ptr(), t.nbytes(), copies_->stream);
    p.bytes += static_cast<int64_t>(t.nbytes());
    p.device_buffers.push_back(t);
    t = host;
  }
  if (p.device_buffers.empty()) return;
  p.done = std::make_unique<cuda::Event>();
  p.done->record(copies_->stream);
  copies_->bytes += p.bytes;
  copies_->pending.push_back(std::move(p));
  copies_->wait_until(OffloadCopies::cap(host_state_));
  prefetch_after(*copies_, host_state_, params_, index);
}

// Offloading: the parameter updated after `index` in the last step, if it was so: its state copied in on the copy-in
// stream while the backward computes its gradient. The copy waits for the compute stream's work queued so far, which
// includes every earlier use of the blocks its buffers reuse (the allocator hands them out in the compute stream's
// order).
namespace {
void prefetch_after(OffloadCopies& c, const std::vector<std::map<std::string, Tensor>>& host_state,
                    const std::vector<Tensor>& params, size_t index) {
  const size_t k = c.this_step.size();
  c.this_step.push_back(index);
  if (k + 1 >= c.order.size() || c.order[k] != index) return;
  const size_t next = c.order[k + 1];
  if (next >= host_state.size() || host_state[next].empty()) return;
  c.drop_prefetch();
  OffloadCopies::Prefetch f;
  f.index = next;
  for (const auto& [name, host] : host_state[next])
    f.device_buffers[name] = empty(host.shape(), host.dtype(), params[next].device());
  const int device = params[next].device().index;
  cuda::Event queued;
  queued.record(cuda::current_stream(device));
  queued.wait(c.in_stream);
  for (const auto& [name, host] : host_state[next]) {
    const Tensor& dev = f.device_buffers[name];
    cuda::copy_to_device_async(dev.data_ptr(), host.data_ptr(), host.nbytes(), c.in_stream);
  }
  f.done = std::make_unique<cuda::Event>();
  f.done->record(c.in_stream);
  c.prefetch = std::move(f);
}
}  // namespace

void Optimizer::finish_offload() {
  if (!copies_) return;
  copies_->drop_prefetch();
  copies_->wait_until(0);
  copies_->order = std::move(copies_->this_step);
  copies_->this_step.clear();
}

bool Optimizer::has_state(size_t index, const std::string& name) const { return state_[index].count(name) != 0; }

Tensor& Optimizer::state(size_t index, const std::string& name) {
  auto [it, fresh] = state_[index].try_emplace(name);
  if (fresh) it->second = zeros(params_[index].shape(), DType::f32, params_[index].device());
  return it->second;
}

double Optimizer::begin_step() {
  double s = grad_scale_;
  grad_scale_ = 1.0;
  ++step_count_;
  return s;
}

std::map<int64_t, std::vector<size_t>> Optimizer::advance_step_groups() {
  std::map<int64_t, std::vector<size_t>> groups;
  for (size_t i : params_with_grad()) {
    if (!has_state(i, "step")) state_[i]["step"] = from_vector_i64({0}, {});
    groups[++*state_[i]["step"].data<int64_t>()].push_back(i);
  }
  return groups;
}

Optimizer::TracedGroups Optimizer::traced_step_groups() {
  std::map<int64_t, std::vector<size_t>> by_step;
  for (size_t i : params_with_grad()) {
    if (!has_state(i, "step")) state_[i]["step"] = from_vector_i64({0}, {});
    by_step[*state_[i]["step"].data<int64_t>() + 1].push_back(i);
  }
  std::vector<std::vector<size_t>> groups;
  for (auto& [t, idx] : by_step) groups.push_back(idx);
  auto advance = [this, groups]() {
    const double scale = begin_step();
    Tensor hyper = empty({static_cast<int64_t>(groups.size()), 3}, DType::f64);
    double* h = hyper.data<double>();
    for (size_t gi = 0; gi < groups.size(); ++gi) {
      int64_t t = 0;
      for (size_t i : groups[gi]) t = ++*state_[i]["step"].data<int64_t>();
      h[gi * 3] = lr_;
      h[gi * 3 + 1] = static_cast<double>(t);
      h[gi * 3 + 2] = scale;
    }
    return hyper;
  };
  Tensor hyper = advance();
  trace_observer()->on_host_input(hyper, advance);
  return {std::move(groups), hyper};
}

std::map<std::string, Tensor> Optimizer::state_dict() const {
  std::map<std::string, Tensor> sd;
  sd["step"] = from_vector_i64({step_count_}, {});
  for (size_t i = 0; i < state_.size(); ++i)
    for (const auto& [name, t] : state_[i]) sd[std::to_string(i) + "." + name] = t;
  return sd;
}

void Optimizer::load_state_dict(const std::map<std::string, Tensor>& sd) {
  auto step = sd.find("step");
  INGOT_CHECK(step != sd.end() && step->second.numel() == 1, "Optimizer::load_state_dict: missing scalar 'step'");
  std::vector<std::map<std::string, Tensor>> loaded(params_.size()), loaded_host(params_.size());
  for (const auto& [key, t] : sd) {
    if (key == "step") continue;
    size_t dot = key.find('.'), index = 0;
    auto [end, ec] = std::from_chars(key.data(), key.data() + dot, index);
    INGOT_CHECK(dot != std::string::npos && ec == std::errc() && end == key.data() + dot && index < params_.size(),
                "Optimizer::load_state_dict: unexpected entry '", key, "' (expected '<param index>.<state>' with ",
                "index < ", params_.size(), ")");
    const Tensor& p = params_[index];
    if (auto layout = state_layout(index, key.substr(dot + 1))) {
      INGOT_CHECK(t.shape() == layout->first && t.dtype() == layout->second, "Optimizer::load_state_dict: '", key,
                  "' is ", dtype_name(t.dtype()), shape_str(t.shape()), " but parameter ", index, " ",
                  shape_str(p.shape()), " needs ", dtype_name(layout->second), shape_str(layout->first));
    } else {
      // Buffers are shaped like their parameter; counters are scalars.
      INGOT_CHECK(t.shape() == p.shape() || t.numel() == 1, "Optimizer::load_state_dict: '", key, "' has shape ",
                  shape_str(t.shape()), " but parameter ", index, " has shape ", shape_str(p.shape()));
    }
    // Step counters stay on the host; offloaded state goes into its host buffer, the GPU never holding it (Note
    // [Optimizer state offloaded]); the rest to the parameter's device.
    const bool counter = t.numel() == 1 && t.dtype() == DType::i64;
    const bool offloaded = !counter && state_on_host(index);
    Tensor dst = offloaded ? pinned_host_buffer(t.shape(), t.dtype())
                           : empty(t.shape(), t.dtype(), counter ? Device::cpu() : p.device());
    dst.copy_(t);
    loaded[index][key.substr(dot + 1)] = dst;
    if (offloaded) loaded_host[index][key.substr(dot + 1)] = dst;
  }
  state_ = std::move(loaded);
  host_state_ = std::move(loaded_host);
  step_count_ = static_cast<int64_t>(step->second.item());
}

std::optional<std::pair<Shape, DType>> Optimizer::state_layout(size_t, const std::string&) const {
  return std::nullopt;
}

std::unique_ptr<Optimizer> make_optimizer(std::vector<Tensor> params, const OptimizerSpec& spec) {
  if (spec.name == "adamw")
    return std::make_unique<AdamW>(std::move(params), AdamWOptions{.lr = spec.lr,
                                                                   .beta1 = spec.beta1,
                                                                   .beta2 = spec.beta2,
                                                                   .eps = spec.eps,
                                                                   .weight_decay = spec.weight_decay});
  if (spec.name == "adamw8bit")
    return std::make_unique<AdamW8bit>(std::move(params), AdamWOptions{.lr = spec.lr,
                                                                       .beta1 = spec.beta1,
                                                                       .beta2 = spec.beta2,
                                                                       .eps = spec.eps,
                                                                       .weight_decay = spec.weight_decay});
  if (spec.name == "sgd")
    return std::make_unique<SGD>(
        std::move(params),
        SGDOptions{
            .lr = spec.lr, .momentum = spec.momentum, .weight_decay = spec.weight_decay, .nesterov = spec.nesterov});
  if (spec.name == "lion")
    return std::make_unique<Lion>(
        std::move(params),
        LionOptions{.lr = spec.lr, .beta1 = spec.beta1, .beta2 = spec.beta2, .weight_decay = spec.weight_decay});
  INGOT_FAIL("unknown optimizer '", spec.name, "' (expected adamw, adamw8bit, sgd or lion)");
}

int64_t optimizer_state_bytes(const OptimizerSpec& spec, const std::vector<Tensor>& params) {
  int64_t bytes = 0;
  for (const Tensor& p : params) {
    const int64_t n = p.numel();
    if (spec.name == "adamw") bytes += 8 * n;
    else if (spec.name == "adamw8bit")
      bytes += n >= kQuant8MinElements ? 2 * (4 * quant8_code_words(n) + 4 * quant8_blocks(n)) : 8 * n;
    else if (spec.name == "lion") bytes += 4 * n;
    else if (spec.name == "sgd") bytes += spec.momentum != 0 ? 4 * n : 0;
    else INGOT_FAIL("unknown optimizer '", spec.name, "' (expected adamw, adamw8bit, sgd or lion)");
  }
  return bytes;
}

}  // namespace ingot::optim
