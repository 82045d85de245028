// A collective's half as the compiler sees it: the primitives of distributed/collective_ops.cpp split each
// collective into a start (issues the communication, returns the buffer being written) and a collective_wait
// (returns that buffer once it is written), and declare which half they are here, so the scheduler issues starts
// as early and waits as late as it can (compile/lower/lowering.h: schedule_class) without knowing their names.
#pragma once

#include "autograd/primitive.h"

namespace ingot {

enum class CollectivePhase { Start, Wait };
// What a start communicates (a wait communicates nothing: None).
enum class CollectiveOp { None, AllReduce, ReduceScatter, AllGather };

class CollectiveStep {
 public:
  virtual ~CollectiveStep() = default;
  virtual CollectivePhase phase() const = 0;
  virtual CollectiveOp op() const { return CollectiveOp::None; }
};

inline const CollectiveStep* as_collective(const Primitive& p) { return dynamic_cast<const CollectiveStep*>(&p); }

// Whether `p` is a collective's start / its wait.
inline bool is_collective_start(const Primitive& p) {
  const CollectiveStep* c = as_collective(p);
  return c && c->phase() == CollectivePhase::Start;
}
inline bool is_collective_wait(const Primitive& p) {
  const CollectiveStep* c = as_collective(p);
  return c && c->phase() == CollectivePhase::Wait;
}
// Whether `p` starts a collective of kind `op`.
inline bool is_start_of(const Primitive& p, CollectiveOp op) {
  const CollectiveStep* c = as_collective(p);
  return c && c->phase() == CollectivePhase::Start && c->op() == op;
}
// Whether `p` starts an all-gather (ZeRO-1's parameter gather, a ZeRO-3 unit's weights).
inline bool is_all_gather_start(const Primitive& p) { return is_start_of(p, CollectiveOp::AllGather); }
// Whether `p` starts a reduction of gradients: a DDP bucket's all-reduce or a ZeRO reduce-scatter.
inline bool is_reduction_start(const Primitive& p) {
  return is_start_of(p, CollectiveOp::AllReduce) || is_start_of(p, CollectiveOp::ReduceScatter);
}

}  // namespace ingot
