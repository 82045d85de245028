#include "recipes/prefetch.h"

#include <cstring>

#include "runtime/error.h"

namespace ingot::recipes {

struct BatchPrefetcher::Slot {
  std::vector<Tensor> device;   // the batch's device buffers, kept while shapes and dtypes stay the same
  void* staging = nullptr;      // pinned host copy of the batch
  size_t staging_bytes = 0;
  cuda::Event copied, released;  // copy done (copy stream); last reader queued (compute stream)
  bool copied_recorded = false, released_recorded = false, taken = false;
};

namespace {
size_t padded(size_t n) { return (n + 255) / 256 * 256; }
}  // namespace

BatchPrefetcher::BatchPrefetcher(Device device) : device_(device) {
  if (!device_.is_cuda()) return;
  cuda::set_device(device_.index);
  copy_stream_ = cuda::create_stream(device_.index);
  for (int i = 0; i < 2; ++i) slots_.push_back(std::make_unique<Slot>());
}

BatchPrefetcher::~BatchPrefetcher() {
  if (!device_.is_cuda()) return;
  try {
    cuda::synchronize_stream(copy_stream_);  // staging must outlive the copies that read it
    for (auto& s : slots_) cuda::host_free_pinned(s->staging);
    cuda::destroy_stream(copy_stream_);
  } catch (...) {  // a destructor must not throw; the process is likely failing already
  }
}

void BatchPrefetcher::put(const std::vector<Tensor>& host) {
  INGOT_CHECK(pending_ < 0, "BatchPrefetcher: put() twice without take()");
  if (!device_.is_cuda()) {
    cpu_pending_.clear();
    for (const Tensor& t : host) cpu_pending_.push_back(t.to(device_));
    pending_ = 0;
    return;
  }
  Slot& s = *slots_[static_cast<size_t>(next_)];
  const cuda::Stream compute = cuda::current_stream(device_.index);
  // The host may rewrite the staging only once the previous copy out of it is done.
  if (s.copied_recorded) s.copied.synchronize();
  size_t need = 0;
  for (const Tensor& t : host) need += padded(static_cast<size_t>(t.nbytes()));
  if (need > s.staging_bytes) {
    cuda::host_free_pinned(s.staging);
    s.staging = cuda::host_alloc_pinned(need);
    s.staging_bytes = need;
  }
  bool same = s.device.size() == host.size();
  for (size_t i = 0; same && i < host.size(); ++i)
    same = s.device[i].shape() == host[i].shape() && s.device[i].dtype() == host[i].dtype();
  if (!same) {
    // New buffers come from the caching allocator on the compute stream, which may hand out memory that work
    // already queued there still uses: the copy stream starts after that work.
    s.device.clear();
    for (const Tensor& t : host) s.device.push_back(empty(t.shape(), t.dtype(), device_));
    cuda::Event allocated;
    allocated.record(compute);
    allocated.wait(copy_stream_);
  }
  if (s.released_recorded) s.released.wait(copy_stream_);
  size_t offset = 0;
  for (size_t i = 0; i < host.size(); ++i) {
    const Tensor src = host[i].device().is_cpu() ? host[i].contiguous_raw() : host[i].to(Device::cpu());
    char* dst = static_cast<char*>(s.staging) + offset;
    std::memcpy(dst, src.data_ptr(), static_cast<size_t>(src.nbytes()));
    cuda::copy_to_device_async(s.device[i].data_ptr(), dst, static_cast<size_t>(src.nbytes()), copy_stream_);
    offset += padded(static_cast<size_t>(src.nbytes()));
  }
  s.copied.record(copy_stream_);
  s.copied_recorded = true;
  pending_ = next_;
  next_ ^= 1;
}

std::vector<Tensor> BatchPrefetcher::take() {
  INGOT_CHECK(pending_ >= 0, "BatchPrefetcher: take() without a pending put()");
  if (!device_.is_cuda()) {
    pending_ = -1;
    return std::move(cpu_pending_);
  }
  Slot& s = *slots_[static_cast<size_t>(pending_)];
  const cuda::Stream compute = cuda::current_stream(device_.index);
  s.copied.wait(compute);
  // The compute stream now holds the step that read the other slot and not yet the one that will read this
  // slot: where it ends is where the other slot's buffers become free.
  Slot& other = *slots_[static_cast<size_t>(pending_ ^ 1)];
  if (other.taken) {
    other.released.record(compute);
    other.released_recorded = true;
  }
  s.taken = true;
  pending_ = -1;
  return s.device;
}

}  // namespace ingot::recipes
