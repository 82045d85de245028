// Reverse-mode engine. Counts, for every node reachable from the root, how many consumers will send it a
// gradient; runs a node when all have arrived (ready queue ordered newest-first, so memory of late
// activations is released early); accumulates into leaf .grad, running leaf hooks first and post-accumulate
// hooks after. Saved tensors are released after use unless retain_graph.
#include <map>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "autograd/checkpoint.h"
#include "autograd/node.h"
#include "autograd/ops.h"
#include "runtime/kernels/kernels.h"

namespace ingot {
namespace {

Tensor sum_grads(const Tensor& a, const Tensor& b) {
  if (!a.defined()) return b;
  if (!b.defined()) return a;
  return add(a, b);
}

void accumulate_leaf(const std::shared_ptr<TensorImpl>& leaf, Tensor g) {
  for (auto& hook : leaf->hooks) {
    Tensor r = hook(g);
    if (r.defined()) g = r;
  }
  if (TraceObserver* obs = trace_observer()) {
    obs->on_accumulate_grad(leaf, g);  // traced: recorded as ops (compile/trace/trace.cpp)
  } else {
    if (g.dtype() != leaf->dtype) g = g.to(leaf->dtype);
    if (g.shape() != leaf->shape) g = sum_to_shape(g, leaf->shape);
    if (!leaf->grad) {
      // Own the buffer: the incoming gradient may alias another tensor's storage.
      leaf->grad = (g.is_contiguous() ? g : g.contiguous_raw()).clone_raw().impl_ptr();
    } else {
      Tensor acc(leaf->grad);
      INGOT_KERNEL_CALL(acc.device(), binary, kernels::BinaryOp::Add, acc, acc, g);
      acc.bump_version();
    }
  }
  Tensor param(leaf);
  for (auto& hook : leaf->post_accumulate_hooks) hook(param);
}

}  // namespace

void Tensor::backward(const Tensor& grad, bool retain_graph) const {
  INGOT_CHECK(requires_grad(), "backward: tensor does not require grad (did every input have requires_grad=false, "
              "or was it computed under no_grad?)");
  Tensor root_grad = grad;
  if (!root_grad.defined()) {
    INGOT_CHECK(numel() == 1, "backward: grad can be implied only for one-element outputs, got shape ",
                shape_str(shape()));
    root_grad = ones(shape(), dtype(), device());
  }
  INGOT_CHECK(root_grad.shape() == shape(), "backward: grad shape ", shape_str(root_grad.shape()),
              " does not match tensor shape ", shape_str(shape()));
  NoGradGuard no_grad;

  if (is_leaf()) {
    accumulate_leaf(impl_ptr(), root_grad);
    return;
  }

  // Dependency counts over the reachable graph; leaves are counted too, so each leaf's contributions are
  // summed first and its hooks see the total once (PyTorch's AccumulateGrad semantics).
  std::unordered_map<Node*, int> deps;
  std::unordered_map<TensorImpl*, int> leaf_deps;
  std::unordered_map<TensorImpl*, Tensor> leaf_pending;
  std::vector<Node*> stack{impl()->grad_fn.get()};
  std::unordered_set<Node*> seen{stack[0]};
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const Edge& e : n->next) {
      if (e.leaf) ++leaf_deps[e.leaf.get()];
      if (!e.fn) continue;
      ++deps[e.fn.get()];
      if (seen.insert(e.fn.get()).second) stack.push_back(e.fn.get());
    }
  }

  std::unordered_map<Node*, std::vector<Tensor>> pending;
  auto newer_first = [](const std::shared_ptr<Node>& a, const std::shared_ptr<Node>& b) { return a->seq < b->seq; };
  std::priority_queue<std::shared_ptr<Node>, std::vector<std::shared_ptr<Node>>, decltype(newer_first)> ready(newer_first);
  {
    auto& slot = pending[impl()->grad_fn.get()];
    slot.resize(impl()->grad_fn->output_meta.size());
    slot[static_cast<size_t>(impl()->output_nr)] = root_grad;
    ready.push(impl()->grad_fn);
  }

  while (!ready.empty()) {
    std::shared_ptr<Node> node = ready.top();
    ready.pop();
    std::vector<Tensor> cot = std::move(pending[node.get()]);
    pending.erase(node.get());
    cot.resize(node->output_meta.size());
    INGOT_CHECK(!node->released, "backward: trying to backward through the graph a second time (op ",
                node->prim->name(), " at ", node->loc.file_name(), ":", node->loc.line(),
                "); its saved tensors were freed. Pass retain_graph=true to the first backward.");
    bool any_cot = false;
    for (const Tensor& c : cot) any_cot = any_cot || c.defined();
    std::vector<Tensor> grads(node->next.size());
    if (any_cot) {
      if (node->region) detail::checkpoint_restore(*node, retain_graph);
      for (size_t i = 0; i < node->ctx.inputs.size(); ++i) {
        const Tensor& s = node->ctx.inputs[i];
        INGOT_CHECK(!s.defined() || s.version() == node->saved_versions[i], "backward: input ", i, " of ",
                    node->prim->name(), " (recorded at ", node->loc.file_name(), ":", node->loc.line(),
                    ") was modified in place after it was saved for backward");
      }
      try {
        grads = node->prim->vjp(node->ctx, cot);
      } catch (const Error& e) {
        INGOT_FAIL("backward of ", node->prim->name(), " (recorded at ", node->loc.file_name(), ":",
                   node->loc.line(), "): ", e.what());
      }
    }
    INGOT_INTERNAL_CHECK(grads.size() == node->next.size(), node->prim->name(), ": vjp returned ",
                         grads.size(), " grads for ", node->next.size(), " inputs");
    if (!retain_graph) {
      node->ctx.inputs.assign(node->ctx.inputs.size(), Tensor());
      node->ctx.outputs.assign(node->ctx.outputs.size(), Tensor());
      node->released = true;
    }
    for (size_t i = 0; i < node->next.size(); ++i) {
      const Edge& e = node->next[i];
      if (e.leaf) {
        Tensor& acc = leaf_pending[e.leaf.get()];
        if (grads[i].defined()) acc = sum_grads(acc, grads[i]);
        if (--leaf_deps[e.leaf.get()] == 0 && acc.defined()) {
          Tensor g = acc;
          leaf_pending.erase(e.leaf.get());
          accumulate_leaf(e.leaf, g);
        }
        continue;
      }
      if (!e.valid() || !grads[i].defined()) {
        if (e.fn && --deps[e.fn.get()] == 0) ready.push(e.fn);  // runs with zero cotangents: passes counts on
        continue;
      }
      const TensorMeta& m = node->ctx.input_meta[i];
      INGOT_INTERNAL_CHECK(grads[i].shape() == m.shape, node->prim->name(), ": grad ", i, " has shape ",
                           shape_str(grads[i].shape()), ", input has ", shape_str(m.shape));
      auto& slot = pending[e.fn.get()];
      slot.resize(e.fn->output_meta.size());
      slot[static_cast<size_t>(e.output_nr)] = sum_grads(slot[static_cast<size_t>(e.output_nr)], grads[i]);
      if (--deps[e.fn.get()] == 0) ready.push(e.fn);
    }
  }
}

}  // namespace ingot
