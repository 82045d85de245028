// Activation checkpointing (Note [Checkpoint regions], autograd/checkpoint.h).
#include "autograd/checkpoint.h"

#include "autograd/node.h"

namespace ingot {

struct CheckpointRegion {
  struct Saved {
    std::shared_ptr<Primitive> prim;  // the recomputed op, checked against the node it serves
    std::vector<Tensor> inputs, outputs;
    std::vector<uint64_t> versions;
  };
  CheckpointFn fn;
  std::vector<Tensor> inputs;  // detached aliases of the region's inputs: all it keeps for the backward
  std::vector<bool> requires_grad;
  std::vector<uint64_t> versions;
  std::vector<Tensor> replayed;  // checkpoint_replay values made in the forward, in order
  size_t nodes = 0;              // tape nodes the forward recorded
  std::vector<Saved> saved;      // per node, once recomputed
  bool recomputed = false;
};

namespace {

struct Active {
  std::shared_ptr<CheckpointRegion> region;
  bool recompute = false;
  size_t next_node = 0, next_replay = 0;
};
thread_local Active* t_active = nullptr;

class ActiveScope {
 public:
  explicit ActiveScope(Active* a) : prev_(t_active) { t_active = a; }
  ~ActiveScope() { t_active = prev_; }
  ActiveScope(const ActiveScope&) = delete;
  ActiveScope& operator=(const ActiveScope&) = delete;

 private:
  Active* prev_;
};

class GradModeScope {
 public:
  explicit GradModeScope(bool on) : prev_(grad_enabled()) { set_grad_enabled(on); }
  ~GradModeScope() { set_grad_enabled(prev_); }
  GradModeScope(const GradModeScope&) = delete;
  GradModeScope& operator=(const GradModeScope&) = delete;

 private:
  bool prev_;
};

void recompute(const std::shared_ptr<CheckpointRegion>& region) {
  CheckpointRegion& r = *region;
  std::vector<Tensor> ins;
  for (size_t i = 0; i < r.inputs.size(); ++i) {
    const Tensor& t = r.inputs[i];
    INGOT_CHECK(!t.defined() || t.version() == r.versions[i], "checkpoint: input ", i,
                " of a checkpointed region was modified in place after its forward; the backward recomputes the "
                "region from it");
    Tensor x = t.defined() ? t.detach() : Tensor();
    if (r.requires_grad[i]) x.set_requires_grad(true);
    ins.push_back(x);
  }
  r.saved.assign(r.nodes, {});
  Active a{region, true};
  {
    ActiveScope scope(&a);
    GradModeScope grad(true);
    r.fn(ins);
  }
  INGOT_CHECK(a.next_node == r.nodes, "checkpoint: recomputing a region recorded ", a.next_node,
              " differentiable ops where its forward recorded ", r.nodes,
              " (a checkpointed function must run the same ops each time)");
  r.recomputed = true;
  r.fn = nullptr;
  r.inputs.clear();
  r.replayed.clear();
}

}  // namespace

bool recomputing() { return t_active && t_active->recompute; }

std::vector<Tensor> checkpoint(CheckpointFn fn, const std::vector<Tensor>& inputs) {
  if (!grad_enabled() || t_active) return fn(inputs);
  auto region = std::make_shared<CheckpointRegion>();
  for (const Tensor& t : inputs) {
    region->inputs.push_back(t.defined() ? t.detach() : Tensor());
    region->requires_grad.push_back(t.defined() && t.requires_grad());
    region->versions.push_back(t.defined() ? t.version() : 0);
  }
  Active a{region, false};
  std::vector<Tensor> outs;
  {
    ActiveScope scope(&a);
    outs = fn(inputs);
  }
  region->fn = std::move(fn);
  return outs;
}

Tensor checkpoint_replay(const std::function<Tensor()>& make) {
  Active* a = t_active;
  if (!a) return make();
  CheckpointRegion& r = *a->region;
  if (!a->recompute) {
    r.replayed.push_back(make());
    return r.replayed.back();
  }
  INGOT_CHECK(a->next_replay < r.replayed.size(), "checkpoint: recomputing a region drew more host values (",
              a->next_replay + 1, ") than its forward (", r.replayed.size(),
              "); a checkpointed function must run the same ops each time");
  return r.replayed[a->next_replay++];
}

namespace detail {

void checkpoint_on_record(Node& node) {
  Active* a = t_active;
  if (!a) return;
  CheckpointRegion& r = *a->region;
  if (!a->recompute) {
    node.region = a->region;
    node.region_index = r.nodes++;
    node.ctx.inputs.assign(node.ctx.inputs.size(), Tensor());
    node.ctx.outputs.assign(node.ctx.outputs.size(), Tensor());
    return;
  }
  INGOT_CHECK(a->next_node < r.nodes, "checkpoint: recomputing a region records more differentiable ops than its "
              "forward (", r.nodes, "); a checkpointed function must run the same ops each time");
  CheckpointRegion::Saved& s = r.saved[a->next_node++];
  s.prim = node.prim;
  s.inputs = std::move(node.ctx.inputs);
  s.outputs = std::move(node.ctx.outputs);
  s.versions = node.saved_versions;
}

void checkpoint_restore(Node& node, bool retain_graph) {
  if (!node.region->recomputed) recompute(node.region);
  CheckpointRegion::Saved& s = node.region->saved[node.region_index];
  INGOT_CHECK(s.prim && s.prim->name() == node.prim->name(), "checkpoint: op ", node.region_index, " of a region was ",
              node.prim->name(), " in its forward but ", s.prim ? std::string(s.prim->name()) : "missing",
              " when recomputed (a checkpointed function must run the same ops each time)");
  node.ctx.inputs = s.inputs;
  node.ctx.outputs = s.outputs;
  node.saved_versions = s.versions;
  if (!retain_graph) s = {};
}

}  // namespace detail

}  // namespace ingot
