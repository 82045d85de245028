// CPU multi-tensor optimizer kernels (adamw_multi, sgd_multi; contracts in kernel_list.inc). Each parameter
// is updated in one pass over its elements, threads splitting the elements of large tensors. The math is the
// same as the CUDA kernels: f32 arithmetic per element, bias corrections computed once in double.
//
// params [n] f32 (AdamW: or bf16, updated without f32 masters and rounded stochastically, Note [Stochastic
// rounding] in runtime/kernels/scalar_math.h), grads [n] any float dtype, state [n] f32, all contiguous and of
// equal shape per index.
#include <cmath>

#include "runtime/kernels/adamw_consts.h"
#include "runtime/kernels/cpu/loops.h"
#include "runtime/kernels/kernels.h"
#include "runtime/kernels/scalar_math.h"

namespace ingot::kernels::cpu {
namespace {

void check_slot(const char* op, size_t i, const Tensor& p, const Tensor& g, std::initializer_list<const Tensor*> state,
                bool bf16_params = false) {
  INGOT_CHECK((p.dtype() == DType::f32 || (bf16_params && p.dtype() == DType::bf16)) && p.is_contiguous(), op,
              ": parameter ", i, " must be a contiguous f32", bf16_params ? " or bf16" : "", " tensor, got ",
              dtype_name(p.dtype()), shape_str(p.shape()));
  INGOT_CHECK(is_floating(g.dtype()) && g.is_contiguous() && g.shape() == p.shape(), op, ": grad ", i,
              " must be a contiguous float tensor of shape ", shape_str(p.shape()), ", got ", dtype_name(g.dtype()),
              shape_str(g.shape()));
  for (const Tensor* s : state)
    INGOT_CHECK(s->dtype() == DType::f32 && s->is_contiguous() && s->shape() == p.shape(), op, ": state ", i,
                " must be a contiguous f32 tensor of shape ", shape_str(p.shape()));
}

}  // namespace

void adamw_multi(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                 const std::vector<Tensor>& exp_avg, const std::vector<Tensor>& exp_avg_sq, const AdamWArgs& args) {
  INGOT_INTERNAL_CHECK(grads.size() == params.size() && exp_avg.size() == params.size() &&
                       exp_avg_sq.size() == params.size());
  const AdamWConsts c = adamw_consts(args, "adamw_multi");
  for (size_t i = 0; i < params.size(); ++i) {
    check_slot("adamw_multi", i, params[i], grads[i], {&exp_avg[i], &exp_avg_sq[i]}, /*bf16_params=*/true);
    float* m = exp_avg[i].data<float>();
    float* v = exp_avg_sq[i].data<float>();
    const int64_t n = params[i].numel();
    const bool sr = params[i].dtype() == DType::bf16;
    float* p32 = sr ? nullptr : params[i].data<float>();
    bf16_t* p16 = sr ? params[i].data<bf16_t>() : nullptr;
    dispatch_dtype(grads[i].dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T* g = grads[i].data<T>();
#pragma omp parallel for schedule(static) if (n >= kParallelGrain)
      for (int64_t j = 0; j < n; ++j) {
        float gj = load_one<float>(g + j) * c.scale;
        float mj = c.b1 * m[j] + c.one_minus_b1 * gj;
        float vj = c.b2 * v[j] + c.one_minus_b2 * gj * gj;
        m[j] = mj;
        v[j] = vj;
        const float pj = sr ? load_one<float>(p16 + j) : p32[j];
        const float out = pj * c.decay - c.lr * (mj / c.bc1) / (std::sqrt(vj / c.bc2) + c.eps);
        if (sr) store_one(p16 + j, ig_math::round_bf16_stochastic(out, ig_math::stochastic_salt(j, c.step)));
        else p32[j] = out;
      }
    });
  }
}

// momentum[i] is unused (and may be undefined) when args.momentum == 0.
void sgd_multi(const std::vector<Tensor>& params, const std::vector<Tensor>& grads, const std::vector<Tensor>& momentum,
               const SgdArgs& args) {
  INGOT_INTERNAL_CHECK(grads.size() == params.size() && momentum.size() == params.size());
  const float lr = static_cast<float>(args.lr), mu = static_cast<float>(args.momentum),
              damp = static_cast<float>(1.0 - args.dampening), wd = static_cast<float>(args.weight_decay),
              scale = static_cast<float>(args.grad_scale);
  const bool use_momentum = args.momentum != 0.0, nesterov = args.nesterov, first = args.first_step;
  for (size_t i = 0; i < params.size(); ++i) {
    if (use_momentum) check_slot("sgd_multi", i, params[i], grads[i], {&momentum[i]});
    else check_slot("sgd_multi", i, params[i], grads[i], {});
    float* p = params[i].data<float>();
    float* buf = use_momentum ? momentum[i].data<float>() : nullptr;
    const int64_t n = params[i].numel();
    dispatch_dtype(grads[i].dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T* g = grads[i].data<T>();
#pragma omp parallel for schedule(static) if (n >= kParallelGrain)
      for (int64_t j = 0; j < n; ++j) {
        float d = load_one<float>(g + j) * scale + wd * p[j];
        if (use_momentum) {
          float b = first ? d : mu * buf[j] + damp * d;
          buf[j] = b;
          d = nesterov ? d + mu * b : b;
        }
        p[j] -= lr * d;
      }
    });
  }
}

}  // namespace ingot::kernels::cpu
