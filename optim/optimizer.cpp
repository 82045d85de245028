#include "optim/optimizer.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <cstring>
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
// that parameter in the backward (recipes/train_step.cpp): copied in, updated by the same kernel, copied back. The GPU
// then holds the weights, the activations and a bounded window of state beyond them, at the price of moving the state
// over PCIe twice a step (what torchtune's paged 8-bit AdamW with optimizer_in_bwd does through unified memory): ~16 GB
// each way for an 8B model, ~0.3 s at PCIe 5's ~55 GB/s, which only hides behind a 0.5 s step if the copies in run all
// through it. So the copies in follow the order of the last step's updates on a stream of their own, as far ahead as a
// window of bytes allows (OffloadCopies::ahead_cap): topped up after every update and at the end of a step, so that the
// first parameters of the next backward are copied in beside its forward. The copies back run on another stream once an
// update is done, at most cap() bytes waiting; the last ones run on into the next step's forward (each copy in of a
// parameter waits on the GPU for its copy back; state_dict and load_state_dict wait for them all: settle_offload). A
// parameter that comes out of that order drops what was copied ahead and is copied in on the compute stream before its
// update (so are the first step's). A step's arithmetic is unchanged. Checkpoints save the host buffers as any state; a
// resumed run loads into host buffers directly (dropping what was copied ahead), so the GPU never holds all of it. 8B
// full fine-tune on an H200 (bench/RESULTS.md, thirty-seventh session): 21.46 GB at 544-545 ms/step (639 ms copying
// only the next parameter's ahead and waiting for the copies back at each step's end; 497 ms with the state on the
// GPU); with the copies back waited for at the step's end, a 2 GiB window gained ~20 ms for 1.1 GB more, 4 GiB
// nothing more (PCIe: ~51 GB/s in, ~55 out). A compiled step does the same through the same calls: its graph binds
// each parameter's state just in time for the update (restore_state) and hands it back after (offload_state), and
// runs release_offload_copies / finish_offload where an eager step does (Note [Inputs bound just in time],
// compile/ir/graph.h; recipes/train_step.cpp registers them while tracing, its first step eager so the state exists):
// 494.8 ms at 20.72 GB with train.trained_head_in_chunks, 537.8 eager, 463 compiled with the state on the GPU at
// 34.90 GB (bench/RESULTS.md, thirty-eighth session).
namespace {
Tensor pinned_host_buffer(const Shape& shape, DType dtype) {
  const size_t bytes = static_cast<size_t>(numel(shape)) * itemsize(dtype);
  void* p = cuda::host_alloc_pinned(bytes);
  return from_blob(std::shared_ptr<void>(p, [](void* q) { cuda::host_free_pinned(q); }), p, shape, dtype,
                   Device::cpu());
}

int64_t state_bytes(const std::map<std::string, Tensor>& named) {
  int64_t b = 0;
  for (const auto& [name, t] : named) b += static_cast<int64_t>(t.nbytes());
  return b;
}

// INGOT_OFFLOAD_AHEAD=<bytes>: the window of state copied in ahead (Note [Optimizer state offloaded]); for
// measuring, 0 copies in only the next parameter's.
std::optional<int64_t> ahead_override() {
  const char* v = std::getenv("INGOT_OFFLOAD_AHEAD");
  if (v == nullptr || *v == '\0') return std::nullopt;
  int64_t n = 0;
  const char* end = v + std::strlen(v);
  auto [p, ec] = std::from_chars(v, end, n);
  INGOT_CHECK(ec == std::errc() && p == end && n >= 0, "INGOT_OFFLOAD_AHEAD must be a number of bytes >= 0, got '",
              v, "'");
  return n;
}
}  // namespace

// The copies of offloaded state in flight (Note [Optimizer state offloaded]). Copies back run on `stream`: each holds
// its device buffers until its event says it is done; at most cap() bytes wait (the oldest are waited for beyond it:
// an eighth of the state offloaded, at most 1 GiB). Copies in run ahead on `in_stream` in last step's order, at most
// ahead_cap() bytes of them (at least one parameter's).
struct OffloadCopies {
  struct Pending {
    size_t index = 0;
    std::vector<Tensor> device_buffers;
    std::unique_ptr<cuda::Event> done;
    int64_t bytes = 0;
  };
  struct Ahead {
    size_t index = 0;
    std::map<std::string, Tensor> device_buffers;
    std::unique_ptr<cuda::Event> done;
    int64_t bytes = 0;
  };
  cuda::Stream stream, in_stream;
  std::deque<Pending> pending;
  int64_t bytes = 0;  // waiting to be copied back
  int64_t offloaded = 0;  // all the state on the host, counted once
  std::vector<size_t> order, this_step;  // the parameters in the order of their updates: last step's, this one's
  size_t next = 0;  // order[next] is the next parameter to copy in ahead
  std::deque<Ahead> ahead;
  int64_t ahead_bytes = 0;
  const std::optional<int64_t> ahead_env = ahead_override();

  explicit OffloadCopies(int device) : stream(cuda::create_stream(device)), in_stream(cuda::create_stream(device)) {}
  ~OffloadCopies() {
    drop_ahead();
    wait_until(0);
    cuda::destroy_stream(stream);
    cuda::destroy_stream(in_stream);
  }
  void count(const std::vector<std::map<std::string, Tensor>>& host_state) {
    offloaded = 0;
    for (const auto& named : host_state) offloaded += state_bytes(named);
  }
  int64_t cap() const { return std::min<int64_t>(int64_t{1} << 30, offloaded / 8); }
  int64_t ahead_cap() const { return ahead_env ? *ahead_env : cap(); }
  // Copies nobody takes (the order changed, or the host buffers were replaced): their buffers are freed only once
  // their copies are done, and nothing more is copied ahead this step.
  void drop_ahead() {
    for (Ahead& a : ahead) a.done->synchronize();
    ahead.clear();
    ahead_bytes = 0;
    next = order.size();
  }
  void wait_until(int64_t limit) {
    while (!pending.empty() && bytes > limit) {
      pending.front().done->synchronize();
      bytes -= pending.front().bytes;
      pending.pop_front();
    }
  }
  // Frees the device buffers of every copy back once `s` (and `in_stream`, whose blocks the copies in take) has
  // waited for them on the GPU: the allocator hands a stream's blocks out in its order, so no later work on either
  // reuses one before its copy is done; the host blocks for none.
  void release_after(cuda::Stream s) {
    for (Pending& p : pending) {
      p.done->wait(s);
      p.done->wait(in_stream);
    }
    pending.clear();
    bytes = 0;
  }
  // `s` waits (on the GPU) for parameter i's copy back if it still runs: its host buffers are complete after.
  void order_after_copy_back(size_t i, cuda::Stream s) const {
    for (const Pending& p : pending)
      if (p.index == i) p.done->wait(s);
  }
  // Copies in the state of the parameters next in last step's order while the window has room. Their buffers are
  // `in_stream`'s blocks (the allocator hands a stream only blocks freed on it), which come back to it only once
  // their last use is done (wait_until, drop_ahead) or ordered before its later work (release_after), so a copy in
  // waits for nothing on the compute stream. (Waiting there for all the work queued so far, as the compute stream's
  // blocks would need, starts each copy only when the GPU reaches where the host was: late, as the host runs ahead.)
  void top_up(const std::vector<std::map<std::string, Tensor>>& host_state, const std::vector<Tensor>& params) {
    while (next < order.size()) {
      const size_t i = order[next];
      const int64_t b = state_bytes(host_state[i]);
      if (!ahead.empty() && ahead_bytes + b > ahead_cap()) return;
      ++next;
      if (b == 0) continue;
      Ahead a;
      a.index = i;
      a.bytes = b;
      order_after_copy_back(i, in_stream);
      {
        cuda::StreamScope on_in(in_stream);
        for (const auto& [name, host] : host_state[i]) {
          Tensor dev = empty(host.shape(), host.dtype(), params[i].device());
          cuda::copy_to_device_async(dev.data_ptr(), host.data_ptr(), host.nbytes(), in_stream);
          a.device_buffers[name] = dev;
        }
      }
      a.done = std::make_unique<cuda::Event>();
      a.done->record(in_stream);
      ahead_bytes += b;
      ahead.push_back(std::move(a));
    }
  }
};

void Optimizer::place_state(size_t index, const std::string& name, const Tensor& t) {
  if (!state_on_host(index)) {
    state_[index][name] = t.to(params_[index].device());
    return;
  }
  Tensor host = pinned_host_buffer(t.shape(), t.dtype());
  host.copy_(t);
  state_[index][name] = host;
  host_state_[index][name] = host;
  if (copies_) copies_->drop_ahead();  // copies of the buffer this replaces
}

// The host buffers to the GPU: the copy made ahead when it is this parameter's (the current stream waits for it),
// else on the current stream, asynchronously, before the update that follows there. Nothing writes a host buffer
// before its copy in is done (its copy back follows the update).
void Optimizer::restore_state(size_t index) {
  if (!state_on_host(index)) return;
  const int device = params_[index].device().index;
  if (!copies_) {  // the first update offloaded (a fresh start's state is made by it; a resumed one's was loaded)
    copies_ = std::make_shared<OffloadCopies>(device);
    copies_->count(host_state_);
  }
  copies_->this_step.push_back(index);
  if (!copies_->ahead.empty() && copies_->ahead.front().index == index) {
    OffloadCopies::Ahead& a = copies_->ahead.front();
    a.done->wait(cuda::current_stream(device));
    for (auto& [name, dev] : a.device_buffers) state_[index][name] = dev;
    copies_->ahead_bytes -= a.bytes;
    copies_->ahead.pop_front();
    return;
  }
  copies_->drop_ahead();  // out of last step's order: this one is copied in below
  copies_->order_after_copy_back(index, cuda::current_stream(device));
  for (const auto& [name, host] : host_state_[index]) {
    Tensor dev = empty(host.shape(), host.dtype(), params_[index].device());
    cuda::copy_to_device_async(dev.data_ptr(), host.data_ptr(), host.nbytes(), cuda::current_stream(device));
    state_[index][name] = dev;
  }
}

std::vector<Tensor> Optimizer::offloaded_state(size_t index) const {
  std::vector<Tensor> out;
  if (!state_on_host(index)) return out;
  for (const auto& [name, host] : host_state_[index]) {
    const Tensor& t = state_[index].at(name);
    INGOT_INTERNAL_CHECK(t.device().is_cuda(), "Optimizer::offloaded_state(", index, "): '", name,
                         "' is not on the GPU (restore_state first)");
    out.push_back(t);
  }
  return out;
}

// The updated state back to its host buffers on the copy stream, once the update is done (an event of the current
// stream), while the backward goes on; then more copied in ahead.
void Optimizer::offload_state(size_t index) {
  if (!state_on_host(index)) return;
  const int device = params_[index].device().index;
  INGOT_INTERNAL_CHECK(copies_ != nullptr, "Optimizer::offload_state(", index, ") without restore_state first");
  cuda::Event updated;
  updated.record(cuda::current_stream(device));
  updated.wait(copies_->stream);
  OffloadCopies::Pending p;
  p.index = index;
  for (auto& [name, t] : state_[index]) {
    if (!t.device().is_cuda()) continue;
    INGOT_INTERNAL_CHECK(t.is_contiguous(), "Optimizer::offload_state: state '", name, "' is not contiguous");
    Tensor& host = host_state_[index][name];
    if (!host.defined() || host.shape() != t.shape() || host.dtype() != t.dtype()) {
      copies_->offloaded -= host.defined() ? static_cast<int64_t>(host.nbytes()) : 0;
      host = pinned_host_buffer(t.shape(), t.dtype());
      copies_->offloaded += static_cast<int64_t>(host.nbytes());
    }
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
  copies_->wait_until(copies_->cap());
  copies_->top_up(host_state_, params_);
}

// The next step's first parameters copied in ahead beside its forward, while this step's last copies back finish
// (each copy in waits for its parameter's copy back on the GPU).
void Optimizer::finish_offload() {
  if (!copies_) return;
  copies_->drop_ahead();  // a step that ended before taking them (none in a normal step)
  copies_->order = std::move(copies_->this_step);
  copies_->this_step.clear();
  copies_->count(host_state_);
  copies_->next = 0;
  copies_->top_up(host_state_, params_);
}

void Optimizer::release_offload_copies() {
  if (copies_ && !copies_->pending.empty())
    copies_->release_after(cuda::current_stream(params_[copies_->pending.front().index].device().index));
}

void Optimizer::settle_offload() const {
  if (copies_) copies_->wait_until(0);
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
  settle_offload();  // the host buffers complete
  std::map<std::string, Tensor> sd;
  sd["step"] = from_vector_i64({step_count_}, {});
  for (size_t i = 0; i < state_.size(); ++i)
    for (const auto& [name, t] : state_[i]) sd[std::to_string(i) + "." + name] = t;
  return sd;
}

void Optimizer::load_state_dict(const std::map<std::string, Tensor>& sd) {
  settle_offload();  // no copy back still writes a host buffer about to be replaced
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
  if (copies_) {  // what was copied ahead came from the buffers just replaced
    copies_->drop_ahead();
    copies_->count(host_state_);
  }
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
