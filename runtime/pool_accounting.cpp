#include "runtime/pool_accounting.h"

#include <algorithm>

#include "runtime/error.h"

namespace ingot {

void PoolAccounting::reserve(Pool p, int64_t bytes) {
  Bytes& b = pools_[p];
  b.reserved += bytes;
  INGOT_INTERNAL_CHECK(b.reserved >= b.allocated, "PoolAccounting: a pool gave back ", -bytes,
                       " bytes of segments with ", b.allocated, " bytes handed out");
  s_.reserved_bytes += bytes;
  if (bytes > 0) ++s_.num_system_allocs;
  if (b.holds > 0) s_.graph_pool_bytes += bytes;
  raise_peak();
}

void PoolAccounting::allocate(Pool p, int64_t bytes) {
  Bytes& b = pools_[p];
  b.allocated += bytes;
  INGOT_INTERNAL_CHECK(b.allocated >= 0 && b.allocated <= b.reserved, "PoolAccounting: a pool has ", b.allocated,
                       " bytes handed out of ", b.reserved, " reserved");
  s_.allocated_bytes += bytes;
  if (bytes > 0) ++s_.num_allocs;
  // A held pool's block changes hands between its graphs and the code that allocates: in use either way.
  if (b.holds > 0) s_.graph_pool_bytes -= bytes;
  raise_peak();
}

void PoolAccounting::hold(Pool p) {
  Bytes& b = pools_[p];
  if (b.holds++ > 0) return;
  s_.graph_pool_bytes += b.reserved - b.allocated;
  raise_peak();
}

void PoolAccounting::release(Pool p) {
  auto it = pools_.find(p);
  INGOT_INTERNAL_CHECK(it != pools_.end() && it->second.holds > 0, "PoolAccounting: release of a pool not held");
  Bytes& b = it->second;
  if (--b.holds == 0) s_.graph_pool_bytes -= b.reserved - b.allocated;
}

bool PoolAccounting::held(Pool p) const {
  auto it = pools_.find(p);
  return it != pools_.end() && it->second.holds > 0;
}

void PoolAccounting::reset_peak() { s_.peak_allocated_bytes = s_.in_use_bytes(); }

void PoolAccounting::raise_peak() { s_.peak_allocated_bytes = std::max(s_.peak_allocated_bytes, s_.in_use_bytes()); }

}  // namespace ingot
