// Runs a Graph. Values live in an environment indexed by value id; each is released after its last use
// (liveness from the schedule), so peak memory follows the graph, not the trace. Fused groups with a
// compiled kernel (compile/lower/lower_kernel.h) run as one call; every other node runs its primitive's eager
// eval() (matmuls, attention, norms: the extern ops). After the run, write-backs copy values into the
// captured tensors' buffers and grad outputs become the parameters' .grad.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <utility>
#include <vector>

#include "compile/ir/graph.h"

namespace ingot::compiler {

// A generated kernel whose only host reads are scalars it computes from host inputs (the fused AdamW update: its
// learning rate, bias corrections and grad scale): a CUDA graph can capture it reading them from device memory
// that is refreshed before every replay (Note [Scalars read from the device], compile/exec/graph_replay.h).
struct HostScalars {
  size_t count = 0;  // doubles
  // The scalars of this call, on the host, from env's host inputs (what the kernel is otherwise passed).
  std::function<void(const std::vector<Tensor>& env, double* out)> compute;
  // The step, its kernel reading the `count` scalars at `device_scalars` (device memory) when it runs.
  std::function<void(std::vector<Tensor>& env, const double* device_scalars)> run;
};

// A compiled group's step: how it runs, and (optional) how it runs reading its scalars from the device.
struct GroupKernel {
  std::function<void(std::vector<Tensor>& env)> run;
  std::shared_ptr<const HostScalars> host_scalars;
};

// One step of the executable: a node, or a fused group run by `kernel` (which reads and writes env).
struct ExecStep {
  int32_t node = -1;
  int32_t group = -1;
  std::function<void(std::vector<Tensor>& env)> kernel;
  std::shared_ptr<const HostScalars> host_scalars;  // set when the kernel can read its scalars from the device
  std::vector<int32_t> release;  // values dead after this step
  std::vector<int32_t> placed;   // values it makes in their bucket's buffer (Note [Values placed in buckets])
  bool update_in_place = false;  // an InPlaceUpdate node whose every written input may be overwritten
  // Note [Inputs bound just in time] (compile/ir/graph.h): the groups of Graph::just_in_time bound before this step
  // and handed back after it; whether Graph::before_backward runs before it (the first step after the forward's).
  std::vector<int32_t> bind_before, done_after;
  bool before_backward = false;
};

// Whether node `node_index` may write its output `out_value` over its input `in_value`: the input is a graph input
// that nothing after the node reads and whose write-back is that output (the write-back then finds the value in
// place and copies nothing).
bool in_place_ok(const Graph& g, int32_t node_index, int32_t in_value, int32_t out_value);

struct Executable {
  Graph graph;
  std::vector<ExecStep> steps;
  size_t kernels = 0;  // compiled fused kernels used by the steps
};

// Steps with liveness: one per node, except that a fusion group with an entry in `group_kernels` runs as one
// step (its members must be contiguous: compile/passes/schedule.cpp).
std::vector<ExecStep> plan_steps(const Graph& g, const std::map<int32_t, GroupKernel>& group_kernels = {});
// Runs the executable on the caller's args (already checked against the graph's signature). Inputs bound just in time
// (Note [Inputs bound just in time]) are bound and handed back around the steps that use them, and the graph's host
// work runs before the backward's first step and after the last.
std::vector<Tensor> execute(const Executable& exe, const std::vector<Tensor>& args);

// Note [Buckets from an allocator]: where the buffer of a data-parallel bucket comes from (Note [Values placed in
// buckets], compile/ir/graph.h). By default each run allocates it like any value; a caller may install an allocator
// instead, given the graph and bucket value it is for (bench/step_bench.h under INGOT_SYMMETRIC_BUCKETS=1: buckets in
// NCCL symmetric windows, the same buffer every step). Process-wide; nullptr restores the default.
using BucketAllocator = std::function<Tensor(const Graph* g, int32_t value, const Shape& shape, DType dtype, Device device)>;
void set_bucket_allocator(BucketAllocator allocator);

// execute() in its three parts, for runners that order the steps differently (compile/exec/graph_replay.h):
// the value environment with every graph input bound (host inputs produced now; `captured` collects the
// storages of captured tensors), one step (without its releases), and the results, write-backs and .grads.
std::vector<Tensor> bind_inputs(const Graph& g, const std::vector<Tensor>& args, std::set<const Storage*>* captured);
void run_step(const Graph& g, const ExecStep& s, std::vector<Tensor>& env);
// A node step's body: evaluates `n` on env, writing its outputs; `release` are the values dead after it (an
// output may take over a dead input's buffer, Note [Outputs over dead inputs]).
void run_node(const Node& n, const std::vector<int32_t>& release, std::vector<Tensor>& env);
// The nodes step i runs, [first, last): up to the next step's node (a fusion group's members are contiguous).
std::pair<size_t, size_t> step_node_range(const Executable& exe, size_t i);
std::vector<Tensor> finish(const Graph& g, const std::vector<Tensor>& env, const std::set<const Storage*>& captured);

}  // namespace ingot::compiler
