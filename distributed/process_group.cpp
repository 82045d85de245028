// Backend-independent parts of process groups: Work, the flight recorder, sequence numbers and the failure
// report that names the ranks that never joined a collective.
#include "distributed/process_group.h"

#include <cstdlib>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "runtime/file_util.h"

namespace ingot::distributed {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Max: return "max";
  }
  return "?";
}

// ---- Work --------------------------------------------------------------------------------------------------

bool Work::is_completed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

void Work::wait(Millis timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (timeout == Millis::max()) {
    cv_.wait(lock, [&] { return done_; });
  } else if (!cv_.wait_for(lock, timeout, [&] { return done_; })) {
    INGOT_FAIL(op_, " #", seq_, ": wait timed out after ", timeout.count(), " ms (the collective is still running)");
  }
  if (error_) std::rethrow_exception(error_);
}

void Work::block_stream(cuda::Stream) { wait(); }

void Work::finish(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_) return;
    done_ = true;
    error_ = error;
  }
  cv_.notify_all();
}

// ---- FlightRecorder ----------------------------------------------------------------------------------------

namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

const char* state_name(FlightRecorder::State s) {
  switch (s) {
    case FlightRecorder::State::Scheduled: return "scheduled";
    case FlightRecorder::State::Started: return "started";
    case FlightRecorder::State::Completed: return "completed";
    case FlightRecorder::State::Failed: return "failed";
  }
  return "?";
}

}  // namespace

void FlightRecorder::record(int64_t seq, const std::string& op, const Tensor& t) {
  std::lock_guard<std::mutex> lock(mu_);
  Entry e;
  e.seq = seq;
  e.op = op;
  if (t.defined()) {
    e.dtype = std::string(dtype_name(t.dtype()));
    e.numel = t.numel();
  }
  e.t_issue_ms = ms_since(t0_);
  entries_.push_back(std::move(e));
  while (entries_.size() > capacity_) entries_.pop_front();
}

void FlightRecorder::update(int64_t seq, State s) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = entries_.rbegin(); it != entries_.rend(); ++it) {
    if (it->seq != seq) continue;
    it->state = s;
    if (s == State::Completed || s == State::Failed) it->t_end_ms = ms_since(t0_);
    return;
  }
}

std::vector<FlightRecorder::Entry> FlightRecorder::entries() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {entries_.begin(), entries_.end()};
}

std::string FlightRecorder::dump(const std::string& path, const std::string& group, int rank, int size,
                                 const std::string& reason) const {
  nlohmann::json j;
  j["group"] = group;
  j["rank"] = rank;
  j["world_size"] = size;
  j["reason"] = reason;
  j["collectives"] = nlohmann::json::array();
  for (const Entry& e : entries())
    j["collectives"].push_back({{"seq", e.seq}, {"op", e.op}, {"dtype", e.dtype}, {"numel", e.numel},
                                {"state", state_name(e.state)}, {"issued_ms", e.t_issue_ms},
                                {"ended_ms", e.t_end_ms}});
  std::string text = j.dump(1);
  write_file_atomic(path, [&](std::FILE* f) { write_bytes(f, text.data(), text.size()); });
  return path;
}

// ---- ProcessGroup ------------------------------------------------------------------------------------------

void check_collective_tensor(const Tensor& t, const char* op, bool want_cuda) {
  INGOT_CHECK(t.defined(), op, ": the tensor is undefined");
  INGOT_CHECK(t.is_contiguous(), op, ": the tensor must be contiguous, got shape ", shape_str(t.shape()),
              " with non-dense strides");
  bool is_cuda = t.device().type == DeviceType::cuda;
  INGOT_CHECK(is_cuda == want_cuda, op, ": this process group takes ", want_cuda ? "CUDA" : "CPU",
              " tensors, got a tensor on ", t.device().str());
}

ProcessGroup::ProcessGroup(std::shared_ptr<Store> store, int rank, int size, ProcessGroupOptions options)
    : rank_(rank), size_(size), options_(std::move(options)), recorder_(options_.trace_entries) {
  INGOT_CHECK(store != nullptr, "process group '", options_.name, "': a store is required");
  INGOT_CHECK(size >= 1 && rank >= 0 && rank < size, "process group '", options_.name,
              "': rank must be in [0, world size), got rank ", rank, " of ", size);
  INGOT_CHECK(options_.timeout.count() > 0, "process group '", options_.name, "': timeout must be > 0 ms, got ",
              options_.timeout.count());
  // Groups are created in the same order on every rank, so a per-process count of groups with this name
  // gives each instance its own key namespace (two "world" groups must not read each other's rendezvous keys).
  static std::mutex count_mu;
  static std::map<std::string, int> count;
  int instance;
  {
    std::lock_guard<std::mutex> lock(count_mu);
    instance = count[options_.name]++;
  }
  store_ = std::make_shared<PrefixStore>("pg/" + options_.name + "/" + std::to_string(instance), std::move(store));
}

ProcessGroup::~ProcessGroup() = default;

std::shared_ptr<Work> ProcessGroup::all_gather_cast(Tensor& out, const Tensor& in) {
  if (in.dtype() == out.dtype()) return all_gather(out, in);
  Tensor cast = empty(in.shape(), out.dtype(), in.device());
  cast.copy_(in);
  return all_gather(out, cast);  // every backend keeps its input until the collective read it
}

std::shared_ptr<Work> ProcessGroup::exchange_chunks(Tensor&, const Tensor&) {
  INGOT_FAIL("exchange_chunks: the ", backend(), " process group '", options_.name, "' does not implement it");
}

Tensor ProcessGroup::symmetric_empty(const Shape& shape, DType dtype, Device device) {
  return empty(shape, dtype, device);
}

void ProcessGroup::check_all_to_all(const Tensor& out, const Tensor& in) const {
  INGOT_CHECK(out.numel() == in.numel() && in.numel() % size_ == 0 && in.dtype() == out.dtype(),
              "all_to_all: input and output must hold world size (", size_, ") equal chunks of one dtype, got ",
              in.numel(), " ", dtype_name(in.dtype()), " elements in and ", out.numel(), " ", dtype_name(out.dtype()),
              " out");
}

void ProcessGroup::check_exchange(const Tensor& out, const Tensor& in) const {
  INGOT_CHECK(size_ > 1 && in.numel() % size_ == 0 && out.numel() == in.numel() / size_ * (size_ - 1) &&
                  in.dtype() == out.dtype(),
              "exchange_chunks: input must hold world size (", size_, ") equal chunks and the output world size - 1 "
              "of them, of one dtype, in a world of two or more; got ", in.numel(), " ", dtype_name(in.dtype()),
              " elements in and ", out.numel(), " ", dtype_name(out.dtype()), " out");
}

void ProcessGroup::check_widen(const Tensor& out, const Tensor& in, ReduceOp op) {
  INGOT_CHECK(op == ReduceOp::Sum || op == ReduceOp::Avg, "reduce_scatter_widen: op must be sum or avg, got ",
              reduce_op_name(op));
  INGOT_CHECK(is_floating(in.dtype()) && is_floating(out.dtype()) && itemsize(out.dtype()) >= itemsize(in.dtype()),
              "reduce_scatter_widen: expected a floating input reduced into a floating output at least as wide, got ",
              dtype_name(in.dtype()), " into ", dtype_name(out.dtype()));
}

std::shared_ptr<Work> ProcessGroup::reduce_scatter_widen(Tensor& out, const Tensor& in, ReduceOp op) {
  check_widen(out, in, op);
  if (in.dtype() == out.dtype()) return reduce_scatter(out, in, op);
  Tensor wide = empty(in.shape(), out.dtype(), in.device());
  wide.copy_(in);
  return reduce_scatter(out, wide, op);  // every backend keeps its input until the collective read it
}

void ProcessGroup::check_usable() const {
  std::lock_guard<std::mutex> lock(broken_mu_);
  INGOT_CHECK(broken_.empty(), "process group '", options_.name, "' is unusable after an earlier failure: ",
              broken_);
}

int64_t ProcessGroup::begin(const std::string& op, const Tensor& t) {
  check_usable();
  int64_t seq = next_seq_++;
  recorder_.record(seq, op, t);
  return seq;
}

std::string ProcessGroup::failure_message(int64_t seq, const std::string& op, const std::string& cause) {
  std::ostringstream os;
  os << "[" << backend() << " group '" << options_.name << "' rank " << rank_ << "/" << size_ << "] " << op
     << " #" << seq << " failed: " << cause;
  // Who never joined: every rank that sees this collective fail reports it; those that do not report within
  // the grace period either never reached it (stuck or slower elsewhere) or died.
  std::string prefix = "failure/" + std::to_string(seq) + "/";
  try {
    store_->set(prefix + std::to_string(rank_), op);
    std::vector<std::string> keys;
    for (int r = 0; r < size_; ++r) keys.push_back(prefix + std::to_string(r));
    try {
      store_->wait(keys, options_.report_grace);
    } catch (const Error&) {
    }
    std::vector<int> missing;
    for (int r = 0; r < size_; ++r)
      if (!store_->check({keys[r]})) missing.push_back(r);
    os << "; ranks that never joined it: ";
    if (missing.empty()) os << "none (every rank reached it)";
    for (size_t i = 0; i < missing.size(); ++i) os << (i ? ", " : "[") << missing[i] << (i + 1 == missing.size() ? "]" : "");
  } catch (const Error& e) {
    os << "; could not ask the store which ranks are missing (" << e.what() << ")";
  }
  recorder_.update(seq, FlightRecorder::State::Failed);
  std::string dir = options_.trace_dir;
  if (dir.empty()) {
    const char* env = std::getenv("INGOT_TRACE_DIR");
    dir = env && *env ? env : "/tmp";
  }
  std::string path = dir + "/ingot_collectives_" + options_.name + "_rank" + std::to_string(rank_) + ".json";
  try {
    recorder_.dump(path, options_.name, rank_, size_, cause);
    os << "; recent collectives written to " << path;
  } catch (const Error& e) {
    os << "; could not write the collective trace (" << e.what() << ")";
  }
  std::string msg = os.str();
  {
    std::lock_guard<std::mutex> lock(broken_mu_);
    if (broken_.empty()) broken_ = msg;
  }
  return msg;
}

}  // namespace ingot::distributed
