// Transformer pieces: rotary position embedding (plus its cos/sin tables) and scaled dot-product attention.
//
//   rotary_embedding(x, cos, sin)   one primitive; its VJP is the same primitive rotating the other way
//   scaled_dot_product_attention    one primitive with outputs (out, lse); its VJP applies a backward
//                                   primitive that runs the attention_bwd kernel on (dout, q, k, v, out, lse)
//                                   With positions (packed documents), the last input of both is the i64
//                                   [B, T] tensor of each query's position within its document: data, not a
//                                   shape, so one compiled step serves every packing of its rows.
//
// Attention never builds the [T, S] score matrix out of smaller ops: the kernels own the whole computation
// (see runtime/kernels/cpu/attention.cpp for the math), which is what lets a GPU backend swap in a fused
// implementation with the same inputs and saved state.
#include <cmath>

#include "autograd/ops.h"
#include "autograd/ops/attention_packed.h"
#include "autograd/ops/attrs.h"
#include "runtime/kernels/kernels.h"

namespace ingot {
namespace {

// An uninitialized [B, H, T, D] tensor whose memory is in [B, T, H, D] order.
Tensor empty_bthd(const TensorMeta& m) {
  const int64_t B = m.shape[0], H = m.shape[1], T = m.shape[2], D = m.shape[3];
  Tensor t = empty({B, T, H, D}, m.dtype, m.device);
  return t.as_strided(m.shape, {T * H * D, D, H * D, 1}, t.offset());
}

// Note [Rope of a sum]
// A LoRA projection's output is base + delta, the frozen product plus the adapter's. Rounded to bf16 before the
// rotation, base is already a bf16 value and a delta below half its ulp rounds back to it: early in training (B starts
// at zero and AdamW moves it by ~lr a step) nearly all of the adapters' effect on q and k is lost: the 8B LoRA's loss
// fell half as far in its first step as peft + torch.compile's, whose fused kernel adds in f32 and rounds after the
// rotation, and ~22% less over five (bench/RESULTS.md 2026-11-27, twenty-fifth session; in f32 the two agree). So
// rope takes an optional addend: it rotates x + addend, summed in f32, rounding once; the rotated values are not bf16
// values of base, so a small delta survives on average. Its gradient is the inverse rotation for both.
//
// Inputs (x, cos, sin[, addend]); the tables get no gradient; the addend has x's shape and dtype.
class RopePrim final : public Primitive {
 public:
  explicit RopePrim(bool inverse) : inverse_(inverse) {}
  std::string_view name() const override { return "rope"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override {
    const TensorMeta &x = in[0], &c = in[1], &s = in[2];
    INGOT_CHECK(x.shape.size() == 4, "rotary_embedding: x must be [B, H, T, D], got shape ", shape_str(x.shape));
    INGOT_CHECK(is_floating(x.dtype), "rotary_embedding: x must be floating, got ", dtype_name(x.dtype));
    const int64_t T = x.shape[2], D = x.shape[3];
    INGOT_CHECK(D % 2 == 0, "rotary_embedding: head dim must be even, got ", D);
    const Shape table{T, D / 2}, per_row{x.shape[0], T, D / 2};
    INGOT_CHECK(c.shape == s.shape && (c.shape == table || c.shape == per_row), "rotary_embedding: cos/sin must be ",
                shape_str(table), " (or ", shape_str(per_row), " per row) for x of shape ", shape_str(x.shape),
                ", got ", shape_str(c.shape), " and ", shape_str(s.shape));
    INGOT_CHECK(c.dtype == DType::f32 && s.dtype == DType::f32, "rotary_embedding: cos/sin must be f32, got ",
                dtype_name(c.dtype), " and ", dtype_name(s.dtype));
    if (in.size() > 3)
      INGOT_CHECK(in[3].shape == x.shape && in[3].dtype == x.dtype, "rotary_embedding: the addend must match x (",
                  shape_str(x.shape), " ", dtype_name(x.dtype), "), got ", shape_str(in[3].shape), " ",
                  dtype_name(in[3].dtype));
    return {x};
  }
  // Note [Rope keeps the token-major layout]
  // Attention's q and k come from [B, T, H * D] projections seen as [B, H, T, D] (a transpose, no copy), and their
  // gradients go back the same way. Copying to a contiguous [B, H, T, D] before rotating, and the rotated gradient
  // back to [B, T, H * D] after, moved every q and k twice more per layer (about 7.7 GB a step for an 8B Llama at
  // 2 x 2048 tokens); cuDNN attention takes any layout. So the kernels read x through its strides (the last dim
  // dense) and the result is laid out token-major ([B, T, H, D] memory, seen as [B, H, T, D]) whenever x's heads are
  // adjacent in memory (stride of H = D): a projection's view, a transpose of a token-major result. Else (and for
  // a contiguous [B, H, T, D] x) the result is contiguous [B, H, T, D], as before.
  std::vector<Tensor> eval(const std::vector<Tensor>& in) const override {
    const TensorMeta m = infer(metas_of(in))[0];
    Tensor x = in[0].stride(3) == 1 ? in[0] : in[0].contiguous_raw();
    Tensor addend;
    if (in.size() > 3) {
      // The kernels read the addend with x's strides; two layouts that differ are both made contiguous (exact
      // copies; a LoRA projection's base and delta are views of one layout and need none).
      addend = in[3];
      if (addend.strides() != x.strides()) {
        x = x.contiguous_raw();
        addend = addend.contiguous_raw();
      }
    }
    const bool token_major = m.shape[1] > 1 && m.shape[2] > 1 && x.stride(1) == m.shape[3];
    Tensor out = token_major ? empty_bthd(m) : empty(m.shape, m.dtype, m.device);
    if (out.numel() > 0)
      INGOT_KERNEL_CALL(in[0].device(), rope, out, x, in[1].contiguous_raw(), in[2].contiguous_raw(), inverse_, addend);
    return {out};
  }
  bool saves_input(size_t i) const override { return i == 1 || i == 2; }
  void print_attrs(std::ostream& os) const override {
    if (inverse_) os << "inverse=true";
  }
  // A rotation's transpose is the rotation by the opposite angle; x and the addend get the same gradient.
  std::vector<Tensor> vjp(const VjpContext& c, const std::vector<Tensor>& g) const override {
    Tensor gx = apply1(std::make_shared<RopePrim>(!inverse_), {g[0], c.inputs[1], c.inputs[2]});
    if (c.input_meta.size() > 3) return {gx, Tensor(), Tensor(), gx};
    return {gx, Tensor(), Tensor()};
  }

 private:
  bool inverse_;
};

// Note [Attention layouts]: the CUDA kernels read q, k, v, dout in place (any layout cuDNN accepts) and the
// outputs out, dq, dk, dv are given the [B, T, H, D] memory order of the projections around attention, so the
// permute + reshape on each side are views instead of copies (3 + 1 forward, 4 + 3 backward per layer in GPT-2).
// The CPU kernels take contiguous [B, H, T, D].
bool strided_kernels(const Tensor& t) { return t.device().is_cuda(); }

// The kernels' positions argument: i64 [B, T] contiguous, or undefined when the op has no positions input
// (the input after q, k, v in the forward, after lse in the backward).
Tensor positions_arg(const std::vector<Tensor>& in, size_t at) {
  if (in.size() <= at) return Tensor();
  return in[at].dtype() == DType::i64 ? in[at].contiguous_raw() : in[at].to(DType::i64);
}

// Inputs (dout, q, k, v, out, lse[, positions]); outputs (dq, dk, dv).
class AttentionBwdPrim final : public Primitive, public WithAttrs<AttentionBwdAttrs> {
 public:
  AttentionBwdPrim(bool causal, double scale)
      : WithAttrs<AttentionBwdAttrs>({causal, scale}), causal_(causal), scale_(scale) {}
  std::string_view name() const override { return "attention_bwd"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override {
    return {in[1], in[2], in[3]};
  }
  std::vector<Tensor> eval(const std::vector<Tensor>& in) const override {
    const std::vector<TensorMeta> metas = infer(metas_of(in));
    const bool strided = strided_kernels(in[1]);
    std::vector<Tensor> out;
    if (strided)
      for (const TensorMeta& m : metas) out.push_back(empty_bthd(m));
    else
      out = alloc_outputs(metas);
    std::vector<Tensor> c;
    for (const Tensor& t : in) c.push_back(strided ? t : t.contiguous_raw());
    if (out[0].numel() > 0 && out[1].numel() > 0)
      INGOT_KERNEL_CALL(c[1].device(), attention_bwd, out[0], out[1], out[2], c[0], c[1], c[2], c[3], c[4], c[5],
                        positions_arg(in, 6), causal_, scale_);
    else
      for (Tensor& t : out) t.zero_();
    return out;
  }
  void print_attrs(std::ostream& os) const override {
    os << "causal=" << (causal_ ? "true" : "false") << ", scale=" << scale_;
  }
  bool causal() const { return causal_; }
  double scale() const { return scale_; }

 private:
  bool causal_;
  double scale_;
};

// Inputs (dout, q, k, v, out, lse[, positions]); one output [B, T, (Hq + 2 Hkv) * D]: dq, dk, dv side by side in [B, T, H, D]
// order (attention_packed.h). The backward of GPT-2's fused qkv projection concatenates exactly this; written in
// place, the concatenation's copy of all three gradients (3 per layer) disappears.
class AttentionBwdPackedPrim final : public Primitive {
 public:
  AttentionBwdPackedPrim(bool causal, double scale) : causal_(causal), scale_(scale) {}
  std::string_view name() const override { return "attention_bwd_packed"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override {
    const Shape &q = in[1].shape, &k = in[2].shape;
    return {{{q[0], q[2], (q[1] + 2 * k[1]) * q[3]}, in[1].dtype, in[1].device}};
  }
  std::vector<Tensor> eval(const std::vector<Tensor>& in) const override {
    Tensor packed = alloc_outputs(infer(metas_of(in)))[0];
    const Shape &q = in[1].shape(), &k = in[2].shape();
    const int64_t B = q[0], Hq = q[1], T = q[2], D = q[3], Hkv = k[1], W = packed.shape()[2];
    auto part = [&](int64_t heads, int64_t at) {
      return packed.as_strided({B, heads, T, D}, {T * W, D, W, 1}, packed.offset() + at);
    };
    const Tensor dq = part(Hq, 0), dk = part(Hkv, Hq * D), dv = part(Hkv, (Hq + Hkv) * D);
    if (packed.numel() == 0) return {packed};
    if (q[2] == 0 || k[2] == 0) {
      packed.zero_();
      return {packed};
    }
    if (strided_kernels(in[1])) {
      INGOT_KERNEL_CALL(in[1].device(), attention_bwd, dq, dk, dv, in[0], in[1], in[2], in[3], in[4], in[5],
                        positions_arg(in, 6), causal_, scale_);
      return {packed};
    }
    // The CPU kernels write contiguous [B, H, T, D]; the copies put them in the packed layout.
    std::vector<Tensor> c;
    for (const Tensor& t : in) c.push_back(t.contiguous_raw());
    const std::vector<Tensor> d = alloc_outputs(metas_of({c[1], c[2], c[3]}));
    INGOT_KERNEL_CALL(in[1].device(), attention_bwd, d[0], d[1], d[2], c[0], c[1], c[2], c[3], c[4], c[5],
                      positions_arg(in, 6), causal_, scale_);
    INGOT_KERNEL_CALL(in[1].device(), copy, dq, d[0]);
    INGOT_KERNEL_CALL(in[1].device(), copy, dk, d[1]);
    INGOT_KERNEL_CALL(in[1].device(), copy, dv, d[2]);
    return {packed};
  }
  void print_attrs(std::ostream& os) const override {
    os << "causal=" << (causal_ ? "true" : "false") << ", scale=" << scale_;
  }

 private:
  bool causal_;
  double scale_;
};

// Inputs (q, k, v[, positions]); outputs (out, lse).
class AttentionPrim final : public Primitive {
 public:
  AttentionPrim(bool causal, double scale) : causal_(causal), scale_(scale) {}
  std::string_view name() const override { return "attention"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override {
    const TensorMeta &q = in[0], &k = in[1], &v = in[2];
    INGOT_CHECK(q.shape.size() == 4 && k.shape.size() == 4 && v.shape.size() == 4,
                "scaled_dot_product_attention: q, k, v must be [B, H, T, D], got ", shape_str(q.shape), ", ",
                shape_str(k.shape), ", ", shape_str(v.shape));
    INGOT_CHECK(is_floating(q.dtype) && q.dtype == k.dtype && q.dtype == v.dtype,
                "scaled_dot_product_attention: q, k, v must share one floating dtype, got ", dtype_name(q.dtype),
                ", ", dtype_name(k.dtype), ", ", dtype_name(v.dtype));
    INGOT_CHECK(k.shape == v.shape, "scaled_dot_product_attention: k and v shapes differ: ", shape_str(k.shape),
                " vs ", shape_str(v.shape));
    INGOT_CHECK(q.shape[0] == k.shape[0] && q.shape[3] == k.shape[3],
                "scaled_dot_product_attention: q ", shape_str(q.shape), " and k ", shape_str(k.shape),
                " must agree in batch and head dim");
    INGOT_CHECK(k.shape[1] > 0 && q.shape[1] % k.shape[1] == 0, "scaled_dot_product_attention: query heads (",
                q.shape[1], ") must be a multiple of kv heads (", k.shape[1], ")");
    if (in.size() > 3) {
      const TensorMeta& p = in[3];
      INGOT_CHECK(causal_, "scaled_dot_product_attention: positions (packed documents) need causal attention");
      INGOT_CHECK(is_integral(p.dtype) && p.shape == Shape({q.shape[0], q.shape[2]}),
                  "scaled_dot_product_attention: positions must be an integer [B, T] = ",
                  shape_str(Shape({q.shape[0], q.shape[2]})), ", got ", dtype_name(p.dtype), shape_str(p.shape));
    }
    return {q, {{q.shape[0], q.shape[1], q.shape[2]}, DType::f32, q.device}};
  }
  std::vector<Tensor> eval(const std::vector<Tensor>& in) const override {
    const std::vector<TensorMeta> metas = infer(metas_of(in));
    const bool strided = strided_kernels(in[0]);
    std::vector<Tensor> out = alloc_outputs(metas);
    if (strided) out[0] = empty_bthd(metas[0]);
    auto arg = [&](const Tensor& t) { return strided ? t : t.contiguous_raw(); };
    if (out[0].numel() > 0)
      INGOT_KERNEL_CALL(in[0].device(), attention_fwd, out[0], out[1], arg(in[0]), arg(in[1]), arg(in[2]),
                        positions_arg(in, 3), causal_, scale_);
    return out;
  }
  bool saves_output(size_t) const override { return true; }
  void print_attrs(std::ostream& os) const override {
    os << "causal=" << (causal_ ? "true" : "false") << ", scale=" << scale_;
  }
  std::vector<Tensor> vjp(const VjpContext& c, const std::vector<Tensor>& g) const override {
    // lse is internal state: scaled_dot_product_attention never hands it out, so it has no cotangent.
    INGOT_INTERNAL_CHECK(!g[1].defined(), "attention: lse received a gradient");
    std::vector<Tensor> in{g[0], c.inputs[0], c.inputs[1], c.inputs[2], c.outputs[0], c.outputs[1]};
    if (c.inputs.size() > 3) in.push_back(c.inputs[3]);
    std::vector<Tensor> grads = ingot::apply(std::make_shared<AttentionBwdPrim>(causal_, scale_), in);
    if (c.inputs.size() > 3) grads.emplace_back();  // positions are integers: no gradient
    return grads;
  }

 private:
  bool causal_;
  double scale_;
};

}  // namespace

std::shared_ptr<Primitive> packed_attention_bwd(const Primitive& bwd) {
  const AttentionBwdAttrs* a = match<AttentionBwdAttrs>(bwd);
  return a ? std::make_shared<AttentionBwdPackedPrim>(a->causal, a->scale) : nullptr;
}

Tensor rotary_embedding(const Tensor& x, const Tensor& cos, const Tensor& sin, const Tensor& addend) {
  if (addend.defined()) return apply1(std::make_shared<RopePrim>(false), {x, cos, sin, addend});
  return apply1(std::make_shared<RopePrim>(false), {x, cos, sin});
}

// Computed in f32 the way the Hugging Face / Meta references do (inv_freq in f32, angle = f32(pos) * inv_freq
// in f32), so the tables match theirs bit for bit up to libm rounding even at long positions, where an f64
// angle would differ by ~1e-4.
std::pair<Tensor, Tensor> rope_tables(int64_t seq_len, int64_t head_dim, double theta, Device device,
                                      int64_t start, const Tensor& inv_freq) {
  INGOT_CHECK(head_dim > 0 && head_dim % 2 == 0, "rope_tables: head_dim must be positive and even, got ", head_dim);
  INGOT_CHECK(seq_len >= 0 && start >= 0, "rope_tables: expected seq_len >= 0 and start >= 0, got ", seq_len,
              " and ", start);
  const int64_t half = head_dim / 2;
  std::vector<float> freq(static_cast<size_t>(half));
  if (inv_freq.defined()) {
    INGOT_CHECK(inv_freq.numel() == half, "rope_tables: inv_freq must have head_dim/2 = ", half,
                " elements, got shape ", shape_str(inv_freq.shape()));
    std::vector<double> v = inv_freq.to_vector();
    for (int64_t i = 0; i < half; ++i) freq[i] = static_cast<float>(v[i]);
  } else {
    INGOT_CHECK(theta > 0, "rope_tables: theta must be positive, got ", theta);
    for (int64_t i = 0; i < half; ++i)
      freq[i] = 1.0f / std::pow(static_cast<float>(theta), static_cast<float>(2 * i) / static_cast<float>(head_dim));
  }
  Tensor c = empty({seq_len, half}, DType::f32), s = empty({seq_len, half}, DType::f32);
  float *cp = c.data<float>(), *sp = s.data<float>();
  for (int64_t t = 0; t < seq_len; ++t)
    for (int64_t i = 0; i < half; ++i) {
      const float angle = static_cast<float>(start + t) * freq[i];
      cp[t * half + i] = std::cos(angle);
      sp[t * half + i] = std::sin(angle);
    }
  return {c.to(device), s.to(device)};
}

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                                    std::optional<double> scale, const Tensor& positions) {
  const double sc = scale ? *scale : (q.dim() == 4 ? 1.0 / std::sqrt(static_cast<double>(q.shape()[3])) : 1.0);
  if (positions.defined()) return apply(std::make_shared<AttentionPrim>(causal, sc), {q, k, v, positions})[0];
  return apply(std::make_shared<AttentionPrim>(causal, sc), {q, k, v})[0];
}

}  // namespace ingot
